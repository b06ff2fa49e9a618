import sys

from bench.merge.cli import main

sys.exit(main())
