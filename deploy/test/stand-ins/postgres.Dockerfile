# Stand-in for postgres:16-bookworm (test fixture): Debian's PostgreSQL 15 with an entrypoint that honours the
# official image's POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB and PGDATA, initialised as UTF8.
FROM merge-service-test/bookworm-rootfs:latest
RUN mkdir -p /etc/postgresql-common \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/*
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data LANG=C.UTF-8
VOLUME /var/lib/postgresql/data
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
