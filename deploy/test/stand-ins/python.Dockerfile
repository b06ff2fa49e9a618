# Stand-in for python:3.11-slim-bookworm (test fixture): Debian's Python 3.11 as a virtualenv at /usr/local,
# so `pip install` lands in /usr/local/lib/python3.11/site-packages and `python` is /usr/local/bin/python, as in
# the official image.
FROM merge-service-test/bookworm-rootfs:latest
COPY extra-ca.crt /tmp/extra-ca.crt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /usr/local \
 && if [ -s /tmp/extra-ca.crt ]; then cp /tmp/extra-ca.crt /etc/ssl/certs/ca-certificates.crt \
      && printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf; fi \
 && rm /tmp/extra-ca.crt \
 && /usr/local/bin/python -m pip --version
ENV LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
