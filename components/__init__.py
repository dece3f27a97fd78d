"""rubricflow's library layer: records, params, I/O, LLM backends, retrieval, agents, rubrics, rewards,
training and evaluation. Nothing in this package imports prefect, mlflow or dvc; tasks/ and flows/ do."""
