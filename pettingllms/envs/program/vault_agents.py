"""The vault task (``pettingllms/envs/vault``) as an agent program written with the OpenAI Agents SDK: a reader
``Agent`` relays its half of a code from a card with distractors, an opener ``Agent`` types the code, its own half
first. One attempt per run. The prompts and the worked example per agent are the vault env's own.

Rewards: the opener's is 1 when the vault opens; the reader's is that plus 1 when the last number of its message is
its half (it relayed the right number). A run succeeds when both rewards are positive, i.e. the vault opened.
The preset ``pettingllms train +experiment=cpu_vault_program`` trains it (needs the ``programs`` extra).
"""

from __future__ import annotations

from pettingllms.envs.vault.env import (
    OPENER_ASK, OPENER_EXAMPLE, READER_ASK, READER_EXAMPLE, TEST_SEED_OFFSET, last_number, make_problem, parse_code,
)

AGENTS = ["reader", "opener"]


def tasks(split: str, count: int) -> list[dict]:
    offset = {"train": 0, "test": TEST_SEED_OFFSET}[split]
    return [{"id": p.problem_id, **p.data} for p in (make_problem(offset + i) for i in range(count))]


async def run(task: dict, base_url: str, api_key: str) -> dict[str, float]:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # nothing leaves the machine
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    offline = RunConfig(tracing_disabled=True)
    reader = Agent(name="reader", model=OpenAIChatCompletionsModel(model="reader", openai_client=client))
    opener = Agent(name="opener", model=OpenAIChatCompletionsModel(model="opener", openai_client=client))
    try:
        relay = await Runner.run(reader, [*READER_EXAMPLE, {"role": "user", "content": READER_ASK.format(
            card=task["card"])}], run_config=offline)
        message = str(relay.final_output or "").strip() or "(nothing)"
        typed = await Runner.run(opener, [*OPENER_EXAMPLE, {"role": "user", "content": OPENER_ASK.format(
            message=message, half=task["opener_half"])}], run_config=offline)
    finally:
        await client.close()
    opened = parse_code(str(typed.final_output or "")) == f"{task['opener_half']}{task['reader_half']}"
    relayed = last_number(message) == task["reader_half"]
    return {"reader": float(opened) + float(relayed), "opener": float(opened)}
