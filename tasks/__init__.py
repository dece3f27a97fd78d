"""Pipeline stages: one module per stage, each a Prefect ``@task`` plus a ``main()`` that DVC calls.
A stage reads input files, calls components, writes output files and logs to MLflow.

Importing this package makes Prefect offline by default (a user's own setting wins): no usage telemetry from
the SDK, and none from the server a flow run starts, whose heartbeat otherwise logs a failed call on a machine
without internet; and the temporary server gets two minutes to start (Prefect's 20 s is too short on two cores
busy with a model server, where its first start, which migrates a fresh database, times out). It also marks
this process as the owner of the temporary servers it starts, so that a later stage can stop one whose run was
killed (``tasks.temporary_servers``)."""

import os

for _key, _value in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}.items():
    os.environ.setdefault(_key, _value)

from tasks.temporary_servers import mark_owner

mark_owner()
