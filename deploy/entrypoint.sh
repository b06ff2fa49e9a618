#!/usr/bin/env bash
# Starts one role of the deployment. The Spark roles run in the foreground so the container supervisor sees them.
# `health ROLE` is each role's container healthcheck (deploy/healthcheck.py).
set -euo pipefail
role="${1:-api}"; shift || true
case "$role" in
  api)     exec merge-service api --host 0.0.0.0 --port "${PORT:-8000}" "$@" ;;
  worker)  exec merge-service worker --host 0.0.0.0 "$@" ;;
  migrate) exec merge-service migrate "$@" ;;
  spark-master)
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host 0.0.0.0 --port 7077 --webui-port 8080 ;;
  spark-worker)
    # The work directory holds each executor's files; it must be writable by this user (not under SPARK_HOME).
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker --cores "${SPARK_WORKER_CORES:-2}" \
      --memory "${SPARK_WORKER_MEMORY:-4g}" --work-dir "${SPARK_WORKER_DIR:-/var/lib/merge-service/spark-work}" \
      --webui-port 8081 "${SPARK_MASTER_URL:-spark://spark-master:7077}" ;;
  spark-connect)
    export SPARK_NO_DAEMONIZE=1
    exec "$SPARK_HOME/bin/spark-submit" --class org.apache.spark.sql.connect.service.SparkConnectServer \
      --name "merge-service Spark Connect" --master "${SPARK_MASTER_URL:-spark://spark-master:7077}" \
      --conf spark.connect.grpc.binding.port=15002 "$@" spark-internal ;;
  health)  exec python /opt/merge-service/healthcheck.py "$@" ;;
  *) echo "unknown role: $role (api, worker, migrate, spark-master, spark-worker, spark-connect, health)" >&2; exit 2 ;;
esac
