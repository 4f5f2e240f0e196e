"""Built-in environments. Each registers lazily here, through the same public API a user's package uses."""

from pettingllms.core.registry import register_agent, register_env

register_env("toy_targets", "pettingllms.envs.toy.env:TargetsEnv")
register_agent("toy.target_writer", "pettingllms.envs.toy.env:TargetWriter")

register_env("arith_duo", "pettingllms.envs.arith.env:ArithDuoEnv")
register_agent("arith.solver", "pettingllms.envs.arith.env:Solver")
register_agent("arith.checker", "pettingllms.envs.arith.env:Checker")

register_env("math", "pettingllms.envs.math.env:MathEnv")
register_agent("math.reasoner", "pettingllms.envs.math.env:ReasonerAgent")
register_agent("math.tool", "pettingllms.envs.math.env:ToolAgent")

register_env("code", "pettingllms.envs.code.env:CodeEnv")
register_agent("code.coder", "pettingllms.envs.code.env:CoderAgent")
register_agent("code.tester", "pettingllms.envs.code.env:TesterAgent")

register_env("sokoban", "pettingllms.envs.sokoban.env:SokobanEnv")
register_env("sudoku", "pettingllms.envs.sudoku.env:SudokuEnv")
register_env("plan_path", "pettingllms.envs.plan_path.env:PlanPathEnv")
register_agent("games.tool_agent", "pettingllms.envs.games_common.agents:ToolAgent")
register_agent("games.plan_agent", "pettingllms.envs.games_common.agents:PlanAgent")

register_env("vault", "pettingllms.envs.vault.env:VaultEnv")
register_agent("vault.reader", "pettingllms.envs.vault.env:Reader")
register_agent("vault.opener", "pettingllms.envs.vault.env:Opener")
register_agent("vault.solo", "pettingllms.envs.vault.env:Solo")

# Games of the libraries users already have: the optional `games` extra (open-spiel, textarena).
register_env("openspiel", "pettingllms.envs.openspiel_game.env:OpenSpielEnv")
register_env("textarena", "pettingllms.envs.textarena_game.env:TextArenaEnv")
register_agent("games.seat", "pettingllms.envs.seats:SeatAgent")

# Agent programs (a module with `run` and `tasks`) trained through the run's OpenAI-compatible gateway.
register_env("program", "pettingllms.envs.program:ProgramModule")
register_agent("program_agent", "pettingllms.envs.program:ProgramAgent")

# Environments written for verifiers (v1), trained as agent programs: the optional verifiers package (its own venv:
# scripts/install_verifiers.sh).
register_env("verifiers", "pettingllms.envs.verifiers_env:VerifiersEnv")
