"""Does the verifier read a criterion's wording the right way round? Asks the ``verifier`` role, through the
production path (:func:`~components.methods.coreact.verifier.verify_action`, ``coreact.verifier_mode``), whether each
distinct candidate action of the collected branching points meets one-criterion rubrics whose truth follows from
the action's kind alone: a search or a browse continues the research, a finish answers. Prints, per wording, how
often the verdict is right for each kind.

    python scripts/probe_verifier_wording.py [--max-actions 40] [--set ...]

The wordings are the oracle rubric's negated "Does not give a final answer yet" and positive rewordings of it
(``WORDINGS``). Reads outputs/collect/branching_points.parquet (training questions: tune on these, never on test
questions). Writes outputs/probe/verifier_wording.json. Every call goes through the response cache, so a repeat
is a replay.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.io import read_parquet, write_json
from components.llm.factory import LLMPool
from components.methods.coreact.council import render_prefix
from components.methods.coreact.verifier import verify_action
from components.params_cli import params_from_args, stage_argparser
from components.run_files import out_path
from components.schemas import BranchingPoint, Criterion, Rubric

WORDINGS = {  # wording -> is it met by an action that continues the research (True) or by one that answers (False)
    "Does not give a final answer yet": True,
    "Searches or browses instead of answering": True,
    "Continues the research with a search or a browse": True,
    "Gives a final answer": False,
}


def actions_by_kind(points: list[BranchingPoint], per_kind: int) -> list[tuple[BranchingPoint, str, bool]]:
    """Up to ``per_kind`` distinct (point, action, continues) items of each kind, in the points' order."""
    items, seen, counts = [], set(), {True: 0, False: 0}
    for p in points:
        for c in p.candidates:
            action = " ".join(c.action.split())
            continues = not action.startswith("finish[")
            if (p.question_id, p.depth, action) in seen or counts[continues] >= per_kind or not action:
                continue
            seen.add((p.question_id, p.depth, action))
            counts[continues] += 1
            items.append((p, action, continues))
    return items


async def probe(params, items: list[tuple[BranchingPoint, str, bool]]) -> dict:
    pool = LLMPool(params)
    verifier, obs, mode = pool.role("verifier"), params.coreact.observation_chars, params.coreact.verifier_mode
    try:
        rows = []
        for wording, met_by_continuing in WORDINGS.items():
            rubric = Rubric(criteria=[Criterion(text=wording)])
            for p, action, continues in items:
                v = await verify_action(verifier, p.question, render_prefix(p.prefix, obs), "", action, rubric,
                                        tau=params.coreact.tau, mode=mode)
                rows.append({"wording": wording, "continues": continues, "action": action, "failed": v.failed,
                             "right": None if v.failed else v.satisfied[0] == (continues == met_by_continuing)})
        return {"mode": mode, "rows": rows}
    finally:
        pool.close()


def table(rows: list[dict]) -> list[dict]:
    out = []
    for wording in WORDINGS:
        mine = [r for r in rows if r["wording"] == wording]
        line = {"wording": wording}
        for kind, name in ((True, "search_or_browse"), (False, "finish")):
            judged = [r for r in mine if r["continues"] is kind and not r["failed"]]
            line[f"{name}.n"] = len(judged)
            line[f"{name}.right"] = sum(r["right"] for r in judged) / len(judged) if judged else float("nan")
        line["failed"] = sum(r["failed"] for r in mine)
        out.append(line)
    return out


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--max-actions", type=int, default=40, help="distinct actions of each kind at most")
    args = parser.parse_args()
    params = params_from_args(args)
    points = read_parquet(out_path(params.run, "collect", "branching_points.parquet"), BranchingPoint)
    items = actions_by_kind(points, args.max_actions)
    result = asyncio.run(probe(params, items))
    result["table"] = table(result["rows"])
    write_json(out_path(params.run, "probe", "verifier_wording.json"), result)
    print(f"verifier mode {result['mode']}; {len(points)} points")
    print("| wording | search/browse n | right | finish n | right | failed |\n|---|---|---|---|---|---|")
    for r in result["table"]:
        print(f"| {r['wording']} | {r['search_or_browse.n']} | {r['search_or_browse.right']:.2f} | {r['finish.n']} "
              f"| {r['finish.right']:.2f} | {r['failed']} |")
    print(json.dumps(result["table"], indent=1))


if __name__ == "__main__":
    main()
