"""An agent program with two agents, written against the plain ``openai`` client: a solver answers a sum, a checker
reads the answer and says whether it is right. The solver is rewarded for a right answer, the checker for a right
verdict. ``env.name=program`` runs it by default (``env.options.program=pettingllms.envs.program.example``)."""

from __future__ import annotations

import random
import re

AGENTS = ["solver", "checker"]


def tasks(split: str, count: int) -> list[dict]:
    rng = random.Random({"train": 0, "test": 1}[split])  # disjoint: train sums use even first terms, test odd
    out = []
    for i in range(count):
        a, b = 2 * rng.randint(1, 40) + (split == "test"), rng.randint(1, 50)
        out.append({"id": f"{split}-{i}", "a": a, "b": b})
    return out


async def run(task: dict, base_url: str, api_key: str) -> dict[str, float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    question = f"What is {task['a']} + {task['b']}? Answer with the number only."
    solved = await client.chat.completions.create(
        model="solver", messages=[{"role": "user", "content": question}], max_tokens=16)
    answer = solved.choices[0].message.content or ""
    verdict = await client.chat.completions.create(model="checker", max_tokens=8, messages=[
        {"role": "user", "content": f"{question}\nProposed answer: {answer}\nIs it right? Answer yes or no."}])
    numbers = re.findall(r"-?\d+", answer)
    right = bool(numbers) and int(numbers[-1]) == task["a"] + task["b"]
    says_right = (verdict.choices[0].message.content or "").strip().lower().startswith("yes")
    await client.close()
    return {"solver": float(right), "checker": float(says_right == right)}
