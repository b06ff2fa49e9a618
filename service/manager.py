"""The job store: every database call of the service goes through ``JobManager``, whose rooms each answer one
question: ``store`` (the database and its transactions), ``submissions`` (submitting and cancelling), ``queries``
(the API's reads), ``claims`` (which job may start next) and ``leases`` (the fenced writes of a running attempt).
"""

from __future__ import annotations

from service.claims import JobClaims
from service.leases import JobLeases
from service.queries import JobQueries
from service.submissions import JobSubmissions


class JobManager(JobSubmissions, JobQueries, JobClaims, JobLeases):
    """Submission, claiming, leases and the fenced state changes of merge jobs."""
