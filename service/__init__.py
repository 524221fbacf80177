"""kdvfs.service: the tuner as a service (`kdvfs serve`): jobs and ranks of a fleet share what
they learn. It needs the `service` extra (`pip install 'kdvfs[service]'`).

- schema.py: the pydantic models of every request and reply, with their limits;
- store.py: the database (SQLAlchemy: SQLite in WAL mode, or PostgreSQL): sessions, the
  fleet's observations, task references, versioned plans;
- models.py: the strategies run in the service, one per (fleet, GPU, grid, workload,
  strategy), and the decisions the ranks of a job share;
- app.py: the FastAPI application (auth, rate and size limits, errors without internals,
  one MLflow run per session);
- client.py: the job's side (retries, back-off, local fallback), a Strategy for StepTuner.

The command is cli/commands/serve.py. Design: docs/service.md.
"""
