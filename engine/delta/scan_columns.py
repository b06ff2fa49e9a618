"""The columns a scan adds to a table's rows, by name: where each row came from, and its stable row identity."""

from __future__ import annotations

from typing import Literal

from pyspark.sql import Column
from pyspark.sql import functions as F

FILE_NAME_COL = "_file_name_"
"""The row's file, as its AddFile's log path."""
ROW_INDEX_COL = "_row_index_"
"""The row's position in its file."""
FILE_PATH_COL = "_file_path_"
ROW_ID_COL = "_row_id_"
ROW_COMMIT_VERSION_COL = "_row_commit_version_"
ROW_TRACKING_COLS = (ROW_ID_COL, ROW_COMMIT_VERSION_COL)
LOCAL_PATH_COL = "__delta_local_path"
UNMAPPED_MARKER = "DELTA_SCAN_UNMAPPED_FILE"

FileColumns = Literal["name_and_row_index", "path", "none"]
"""What a scan gives besides the table's columns: the file and row index, the file path, or nothing."""


def checked_file_name() -> Column:
    """The row's log path after a join from Spark's file path; a file Spark read that the scan did not ask for
    (no log path) fails the query rather than passing as a row of no file."""
    return F.when(
        F.col(FILE_NAME_COL).isNull(),
        F.raise_error(F.concat(F.lit(f"[{UNMAPPED_MARKER}] scanned file not in the request: "), F.col(LOCAL_PATH_COL))),
    ).otherwise(F.col(FILE_NAME_COL))
