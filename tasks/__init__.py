"""Pipeline stages: one module per stage, each a Prefect ``@task`` plus a ``main()`` that DVC calls.
A stage reads input files, calls components, writes output files and logs to MLflow."""
