"""The job store: every database call of the service goes through ``JobManager``, whose rooms each answer one
question: ``store`` (the database and its transactions), ``submissions`` (submitting and cancelling), ``queries``
(the API's reads), ``overview`` (the operations page's figures), ``claims`` (which job may start next), ``leases``
(the fenced writes of a running attempt) and ``callback_outbox`` (completion callbacks waiting to be delivered).
"""

from __future__ import annotations

from service.callback_outbox import CallbackOutbox
from service.claims import JobClaims
from service.leases import JobLeases
from service.overview import JobOverview
from service.queries import JobQueries
from service.submissions import JobSubmissions


class JobManager(JobSubmissions, JobQueries, JobOverview, JobClaims, JobLeases, CallbackOutbox):
    """Submission, claiming, leases and the fenced state changes of merge jobs, and their callbacks' outbox."""
