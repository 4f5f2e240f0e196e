"""A doc page's complete example, run as the page says: its Python module saved under the name the page gives, then
its commands (``pettingllms check-env ...`` and ``pettingllms train ...``) from that module's folder."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from pettingllms.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs"


def example_module(page: str) -> str:
    """The Python block of the page's "## A complete example" section."""
    text = (DOCS / page).read_text()
    return re.search(r"## A complete example.*?```python\n(.*?)```", text, flags=re.S).group(1)


def run_page_example(page: str, module_name: str, folder: Path, monkeypatch, capsys) -> Path:
    """Save the page's module as ``<module_name>.py`` in ``folder`` and run the page's check-env and train commands
    (the line after "Saved as `<module_name>.py`") from there, training into ``folder/logs``; returns that folder."""
    text = (DOCS / page).read_text()
    (folder / f"{module_name}.py").write_text(example_module(page))
    block = re.search(rf"Saved as `{module_name}.py`.*?```bash\n(.*?)```", text, flags=re.S).group(1)
    check, train = [shlex.split(line) for line in block.splitlines() if line.strip()]
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert check[0] == "pettingllms" and main(check[1:]) == 0, capsys.readouterr().out
        assert main([*train[1:], f"training.log_dir={folder / 'logs'}"]) == 0
    finally:
        sys.modules.pop(module_name, None)
    return folder / "logs"
