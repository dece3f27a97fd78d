"""The root of ``params.yaml``: ``Params`` composes every section's model, each kept beside the code it configures
(``components/<package>/params.py``, a method's in ``components/methods/<method>/params.py``); here only the
run-wide settings and the sections read by tasks/ and flows/ (``run``, ``deploy``, ``sweep``), and the helpers that
give a method's stage its params. Loading (profiles, overlays, ``--set``) is ``components.params_load``.

    from components.params_load import load_params
    params = with_method_settings(load_params("params.yaml", "paper"), "arbor")   # ARBOR's lr, KL, steps
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator

from components.agents.params import AgentParams, MethodParams
from components.datasets.params import DataParams
from components.evaluation.params import EvaluationParams
from components.lab.params import LabParams
from components.llm.params import LLMParams
from components.methods.arbor.params import ArborParams
from components.methods.arco.params import ArcoParams
from components.methods.coreact.params import CollectParams, CoReActParams, RubricGeneratorParams
from components.methods.rubricem.params import RubricEMParams
from components.params_section import ParamsError, Section, SharedOverrides
from components.retrieval.params import RetrievalParams
from components.training.params import DAPOParams, GRPOParams, LoRAParams, SFTParams, TrainPolicyParams
from components.world.params import WorldParams

OUT_DIR = "{out_dir}"  # in a backend's lora path: run.out_dir


class RunParams(Section):
    out_dir: str = Field(default="outputs", description="Root folder of stage outputs.")
    mlflow_tracking_uri: str = Field(default="sqlite:///mlflow.db", description="MLflow tracking store (SQLite).")
    mlflow_artifact_root: str = Field(default="mlruns", description="Folder of MLflow artifacts.")
    experiment: str = Field(default="rubricflow", description="MLflow experiment name.")
    cache_dir: str = Field(default=".cache", description="Local caches: assembled models, LLM responses.")
    torch_threads: int | None = Field(
        default=None, ge=1,
        description="Threads torch may use for training (None: torch's default). On a shared small machine give "
        "1: torch's OpenMP threads spin against other busy processes and a step gets several times slower.",
    )


class DeployParams(Section):
    """The Prefect deployments ``python -m flows.deploy`` serves (flows/deploy.py)."""

    nightly_cron: str = Field(default="0 2 * * *", description="Cron schedule of the nightly-sweep deployment "
                              "(minute hour day month weekday).")
    timezone: str = Field(default="UTC", description="IANA time zone the cron schedule is read in, e.g. "
                          "Europe/Paris.")

    @model_validator(mode="after")
    def _known_timezone(self) -> DeployParams:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not an IANA time zone, e.g. UTC or Europe/Paris") from None
        return self


class SweepParams(Section):
    """The ablation sweep ``python -m flows.sweep`` runs (flows/sweep.py): ``train_policy`` once per (variant,
    seed) and ``evaluate`` once per (method, seed), each in its own folder, then one comparison report of the
    variants (components/reporting/compare.py) and one of the methods (components/reporting/methods.py)."""

    variants: list[str] = Field(default_factory=lambda: ["grpo", "dapo"], description="Training "
                                "variants compared (names of train_policy --variant).")
    methods: list[str] = Field(default_factory=list, description="Evaluated methods compared (names of evaluate "
                               "--method, params.methods), e.g. Co-ReAct against its baselines and ablations.")
    seeds: list[int] = Field(default_factory=lambda: [1234], min_length=1, description="Seeds each variant trains "
                             "with (the run's `seed`); the report gives the mean and spread over them.")
    out_dir: str = Field(default="sweep", description="Folder of the sweep under run.out_dir: one seed_<s>/ per seed "
                         "(its runs in train/<variant>/) and the report (comparison.csv, .md, .png).")
    runner: Literal["thread", "ray"] = Field(default="thread", description="Where the runs execute: threads of the "
                                             "flow's process, or Ray (the `ray` extra).")
    workers: int = Field(default=2, ge=1, description="Runs at once: threads of the thread runner, CPUs of the local "
                         "Ray instance.")
    ray_address: str | None = Field(default=None, description="A running Ray cluster to submit to (e.g. "
                                    "ray://head:10001); None starts a local instance on this machine.")
    final_steps: int = Field(default=5, ge=1, description="Last training steps whose reward/mean and reward/std the "
                             "report averages.")
    ray_gpus_per_training_task: float = Field(
        default=0, ge=0, description="Ray runner: GPUs each training task (train_policy, sft, "
        "train_rubric_generator) asks Ray for, so Ray runs at most as many at once as the cluster has GPU slots "
        "and pins each to its own (flows/placement.py); evaluation and judging tasks ask for none. 0: no GPU "
        "is asked for (a CPU run); a fraction (0.5) shares one GPU between runs; above 1, whole GPUs.")

    @model_validator(mode="after")
    def _distinct(self) -> SweepParams:
        gpus = self.ray_gpus_per_training_task
        if gpus > 1 and gpus != int(gpus):
            raise ValueError(f"ray_gpus_per_training_task={gpus}: Ray takes a fraction of one GPU or whole GPUs")
        if not self.variants and not self.methods:
            raise ValueError("a sweep needs at least one training variant or evaluated method")
        for key in ("variants", "methods", "seeds"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"{key} must be distinct (a repeated one would overwrite its own run), got {values}")
        return self


class Params(Section):
    profile: str = Field(default="embedded", description="Profile whose overrides are applied.")
    overlay: list[str] = Field(
        default_factory=list, description="Overlays (params.yaml `overlays`) applied over the profile, in order. "
        "Chosen with --overlay NAME (or --set overlay=[NAME]), never in the file: DVC does not track the choice.")
    seed: int = Field(default=1234, description="Global seed; every stage derives its own from it.")
    run: RunParams = Field(default_factory=RunParams)
    data: DataParams = Field(default_factory=DataParams)
    world: WorldParams = Field(default_factory=WorldParams)
    retrieval: RetrievalParams = Field(default_factory=RetrievalParams)
    agent: AgentParams = Field(default_factory=AgentParams)
    llm: LLMParams
    evaluation: EvaluationParams = Field(default_factory=EvaluationParams)
    collect: CollectParams = Field(default_factory=CollectParams)
    lora: LoRAParams = Field(default_factory=LoRAParams)
    grpo: GRPOParams = Field(default_factory=GRPOParams)
    dapo: DAPOParams = Field(default_factory=DAPOParams, description="The dapo variant (DAPO, Yu et al. 2025).")
    train_policy: TrainPolicyParams = Field(default_factory=TrainPolicyParams)
    sft: SFTParams = Field(default_factory=SFTParams)
    rubricem: RubricEMParams = Field(default_factory=RubricEMParams)
    arbor: ArborParams = Field(default_factory=ArborParams)
    arco: ArcoParams = Field(default_factory=ArcoParams)
    coreact: CoReActParams = Field(default_factory=CoReActParams)
    rubric_generator: RubricGeneratorParams = Field(default_factory=RubricGeneratorParams)
    methods: dict[str, MethodParams] = Field(
        default_factory=lambda: {"react": MethodParams(agent="react", description="Plain ReAct (baseline).")},
        description="What `evaluate --method NAME` runs.",
    )
    deploy: DeployParams = Field(default_factory=DeployParams)
    sweep: SweepParams = Field(default_factory=SweepParams)
    lab: LabParams = Field(default_factory=LabParams, description="The lab (components/lab): nano policy, simulated judges' dial.")

    @model_validator(mode="after")
    def _adapters_follow_out_dir(self) -> Params:
        for backend in self.llm.backends.values():
            if isinstance(backend.lora, str):
                backend.lora = backend.lora.replace(OUT_DIR, self.run.out_dir)
            elif backend.lora:
                backend.lora = [path.replace(OUT_DIR, self.run.out_dir) for path in backend.lora]
        return self

    @model_validator(mode="after")
    def _method_overrides_fit(self) -> Params:
        for section in SHARED_OVERRIDE_SECTIONS:
            shared: SharedOverrides = getattr(self, section).shared
            for block in ("grpo", "sft", "agent"):
                values = getattr(shared, block)
                if not values:
                    continue
                model = type(getattr(self, block))
                unknown = sorted(set(values) - set(model.model_fields))
                if unknown:
                    raise ValueError(f"{section}.shared.{block}: unknown key {unknown[0]} (not a {block} key)")
                try:
                    model.model_validate({**getattr(self, block).model_dump(), **values})
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"])
                    raise ValueError(f"{section}.shared.{block}.{where}: {err['msg']}") from None
        return self


SHARED_OVERRIDE_SECTIONS = ("arbor", "rubricem", "arco")  # the method sections with a `shared` block


def with_method_settings(params: Params, section: str | None) -> Params:
    """``params`` with the ``shared`` block of the method section ``section`` applied over the shared ``grpo``,
    ``sft`` and ``agent`` blocks (the params a method's stage runs with; unchanged for None or an empty block).

        params = with_method_settings(params, "arbor")   # the paper profile: ARBOR's lr, KL, steps, searches
    """
    if section is None or section not in SHARED_OVERRIDE_SECTIONS:
        return params
    shared: SharedOverrides = getattr(params, section).shared
    if shared.empty():
        return params
    update = {block: type(getattr(params, block)).model_validate({**getattr(params, block).model_dump(),
                                                                  **getattr(shared, block)})
              for block in ("grpo", "sft", "agent") if getattr(shared, block)}
    return params.model_copy(update=update)


def for_method(params: Params, method: str) -> tuple[Params, MethodParams]:
    """The params a method runs with (its role rebindings applied, validated) and its entry."""
    if method not in params.methods:
        raise ParamsError(f"unknown method {method!r}: params.methods defines {sorted(params.methods)}")
    spec = params.methods[method]
    if not spec.roles:
        return params, spec
    raw = params.model_dump()
    raw["llm"]["roles"] = {**raw["llm"]["roles"], **spec.roles}
    try:
        return Params.model_validate(raw), spec
    except ValidationError as exc:
        raise ParamsError(f"methods.{method}.roles: {exc.errors()[0]['msg']}") from None
