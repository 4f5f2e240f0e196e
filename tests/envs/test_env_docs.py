"""Every built-in env package is named in docs/architecture.md, and the quickstart's env has its page with its
agents and options."""

from __future__ import annotations

import inspect
from pathlib import Path

import pettingllms.envs
from pettingllms.core.registry import get_env_class

ROOT = Path(__file__).resolve().parents[2]
ENVS = Path(pettingllms.envs.__file__).parent


def test_architecture_names_every_built_in_env_package():
    text = (ROOT / "docs" / "architecture.md").read_text()
    listing = text[text.index("Built-in environments live in"):].split("\n\n", 1)[0]
    packages = sorted(p.name for p in ENVS.iterdir() if (p / "__init__.py").exists())
    assert [p for p in packages if f"`{p}`" not in listing] == []


def test_the_vault_page_names_its_agents_and_every_option():
    page = (ROOT / "docs" / "environments" / "vault.md").read_text()
    env = get_env_class("vault")
    assert "`env.name=vault`" in page
    for role, registered in env.agent_classes.items():
        assert f"`{registered}`" in page and role in page
    options = [name for name in inspect.signature(env.__init__).parameters if name not in ("self", "options")]
    for option in options:
        assert f"`env.{option}`" in page or f"`env.options.{option}`" in page, option


def test_the_games_page_names_the_plan_prompts_and_each_cpu_presets_board():
    from pettingllms.config.load import CONFIG_DIR
    from pettingllms.entry.train import load_config
    from pettingllms.envs.games_common.agents import PROMPTS

    page = (ROOT / "docs" / "environments" / "games.md").read_text()
    assert "`agents.plan_agent.options.prompt`" in page
    assert all(f"| `{prompt}`" in page for prompt in PROMPTS)
    presets = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("cpu_*.yaml"))
    assert presets
    for name in presets:
        cfg = load_config("train", [f"+experiment={name}"])
        if cfg.env.name not in ("plan_path", "sokoban", "sudoku"):  # a library game: docs/self_play.md
            continue
        board = ", ".join(f"{key}: {value}" for key, value in cfg.env.options.items())
        assert f"`{name}` | " in page and f"(`{board}`)" in page, (name, board)
