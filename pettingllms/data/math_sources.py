"""Math sources: converters for the hub datasets and offline reasoning-gym generators.

Every row written has ``id``, ``question``, ``answer`` (a string math-verify can read) and ``source``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pettingllms.core.errors import DataError
from pettingllms.data.sources import HubSource, ProceduralSource, Row

DOMAIN = "math"
REQUIRED = ("id", "question", "answer")
TEST_SEED_OFFSET = 1_000_000_007  # reasoning-gym seeds: train uses seed, test seed + this offset


def extract_answer(text: Any) -> str:
    """A final answer from a worked solution: after '####' (GSM8K), the last \\boxed{}, 'Answer:', or the text."""
    text = str(text).strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    match = re.findall(r"Answer\s*:\s*(.+)", text)
    return match[-1].strip() if match else text


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i].strip() or None
    return None


def _row(question: Any, answer: Any, **extra: Any) -> Row | None:
    question, answer = str(question or "").strip(), str(answer if answer is not None else "").strip()
    if not question or not answer:
        return None
    return {"question": question, "answer": answer, **extra}


_DAPO_PREFIX = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def convert_polaris(row: Mapping[str, Any], i: int) -> Row | None:
    return _row(row.get("problem"), row.get("answer"), difficulty=str(row.get("difficulty", "")))


def convert_dapo(row: Mapping[str, Any], i: int) -> Row | None:
    prompt = row.get("prompt")
    content = prompt[0]["content"] if isinstance(prompt, list) and prompt else str(prompt or "")
    question = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", content))
    answer = (row.get("reward_model") or {}).get("ground_truth")
    return _row(question, answer)


def convert_aime_past(row: Mapping[str, Any], i: int) -> Row | None:
    out = _row(row.get("Question"), row.get("Answer"), year=int(row.get("Year") or 0))
    if out is not None and row.get("ID"):
        out["id"] = f"aime_past/{row['ID']}"
    return out


def convert_aime24(row: Mapping[str, Any], i: int) -> Row | None:
    out = _row(row.get("Problem"), row.get("Answer"), year=2024)
    if out is not None and row.get("ID"):
        out["id"] = f"AIME24/{row['ID']}"
    return out


def convert_aime25(row: Mapping[str, Any], i: int) -> Row | None:
    out = _row(row.get("problem") or row.get("question"), row.get("answer"), year=2025)  # earlier hub revisions
    if out is not None and row.get("id") is not None:
        out["id"] = f"AIME25/{row['id']}"
    return out


def convert_olympiadbench(row: Mapping[str, Any], i: int) -> Row | None:
    answers = row.get("final_answer") or []
    answer = answers[0] if isinstance(answers, list) and answers else answers
    question = row.get("question")
    if row.get("context"):
        question = f"{row['context']}\n\n{question}"
    return _row(question, str(answer or "").strip().strip("$").strip())


def convert_math500(row: Mapping[str, Any], i: int) -> Row | None:
    return _row(row.get("problem"), row.get("answer") or extract_answer(row.get("solution", "")))


def convert_gsm8k(row: Mapping[str, Any], i: int) -> Row | None:
    return _row(row.get("question"), extract_answer(row.get("answer", "")))


HUB_SOURCES: dict[str, HubSource] = {s.name: s for s in (
    HubSource("polaris", "train", "POLARIS-Project/Polaris-Dataset-53K", convert_polaris,
              description="POLARIS-53K (the paper's math training set)"),
    HubSource("dapo_math", "train", "BytedTsinghua-SIA/DAPO-Math-17k", convert_dapo, dedupe=True,
              description="DAPO-Math-17k, deduplicated (the hub copy repeats each problem)"),
    HubSource("aime_past", "train", "gneubig/aime-1983-2024", convert_aime_past,
              description="AIME 1983-2024 minus the benchmark years (see --exclude-years)"),
    HubSource("gsm8k", "train", "openai/gsm8k", convert_gsm8k, config="main", hub_split="train",
              description="GSM8K train"),
    HubSource("AIME24", "test", "Maxwell-Jia/AIME_2024", convert_aime24, description="AIME 2024"),
    HubSource("AIME25", "test", "yentinglin/aime_2025", convert_aime25, description="AIME 2025"),
    HubSource("OlympiadBench", "test", "Hothan/OlympiadBench", convert_olympiadbench, config="OE_TO_maths_en_COMP",
              description="OlympiadBench, open-ended English competition maths"),
    HubSource("MATH500", "test", "HuggingFaceH4/MATH-500", convert_math500, hub_split="test", description="MATH-500"),
    HubSource("GSM8K", "test", "openai/gsm8k", convert_gsm8k, config="main", hub_split="test",
              description="GSM8K test"),
)}

#: Benchmark file -> the AIME year it holds; a past-AIME training set must not contain it.
BENCHMARK_YEARS = {"AIME24": 2024, "AIME25": 2025}


def drop_years(rows: list[Row], years: set[int]) -> list[Row]:
    return [r for r in rows if int(r.get("year") or 0) not in years]


def _reasoning_gym(task: str, split: str, count: int, seed: int) -> list[Row]:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise DataError("offline math source needs the reasoning-gym package (pip install reasoning-gym)") from exc
    base = seed + (TEST_SEED_OFFSET if split == "test" else 0)
    dataset = reasoning_gym.create_dataset(task, size=count, seed=base)
    rows = []
    for i, item in enumerate(dataset):
        rows.append({"id": f"{task}/{split}/{base}/{i}", "question": str(item["question"]).strip(),
                     "answer": str(item["answer"]).strip(), "source": task})
    return rows


PROCEDURAL_SOURCES: dict[str, ProceduralSource] = {s.name: s for s in (
    ProceduralSource("gsm_symbolic", lambda split, n, seed: _reasoning_gym("gsm_symbolic", split, n, seed),
                     "reasoning-gym GSM-symbolic word problems (offline)"),
    ProceduralSource("basic_arithmetic", lambda split, n, seed: _reasoning_gym("basic_arithmetic", split, n, seed),
                     "reasoning-gym basic arithmetic expressions (offline)"),
)}

OFFLINE_DEFAULT = ("gsm_symbolic", "basic_arithmetic")
PAPER_DEFAULT = ("polaris", "AIME24", "AIME25")


# ------------------------------------------------------------------------------------------- CLI wiring
def _add_arguments(parser) -> None:
    parser.add_argument("--exclude-years", default="auto",
                        help="AIME years dropped from aime_past: 'auto' = the years of the AIME benchmarks loaded in "
                             "this run or present in <data-root>/math/test (AIME24 -> 2024, AIME25 -> 2025), or a "
                             "comma-separated list, or 'none'")


def excluded_years(args) -> set[int]:
    if args.exclude_years == "none":
        return set()
    if args.exclude_years != "auto":
        return {int(y) for y in args.exclude_years.split(",") if y.strip()}
    requested = set((args.sources or "").split(","))
    test_dir = args.data_root / DOMAIN / "test"
    present = {p.stem for p in test_dir.glob("*.parquet")} if test_dir.is_dir() else set()
    return {year for name, year in BENCHMARK_YEARS.items() if name in requested | present}


def _post(name: str, rows: list[Row], args) -> list[Row]:
    if name == "aime_past":
        return drop_years(rows, excluded_years(args))
    return rows


def domain_spec():
    from pettingllms.data.loader import DomainSpec

    return DomainSpec(DOMAIN, REQUIRED, HUB_SOURCES, PROCEDURAL_SOURCES, offline_default=OFFLINE_DEFAULT,
                      paper_default=PAPER_DEFAULT, post=_post, add_arguments=_add_arguments)
