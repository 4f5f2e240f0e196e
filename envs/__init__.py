"""Built-in environments. Each registers lazily here, through the same public API a user's package uses."""

from pettingllms.core.registry import register_agent, register_env

register_env("toy_targets", "envs.toy.env:TargetsEnv")
register_agent("toy.target_writer", "envs.toy.env:TargetWriter")

register_env("arith_duo", "envs.arith.env:ArithDuoEnv")
register_agent("arith.solver", "envs.arith.env:Solver")
register_agent("arith.checker", "envs.arith.env:Checker")

register_env("math", "envs.math.env:MathEnv")
register_agent("math.reasoner", "envs.math.env:ReasonerAgent")
register_agent("math.tool", "envs.math.env:ToolAgent")

register_env("code", "envs.code.env:CodeEnv")
register_agent("code.coder", "envs.code.env:CoderAgent")
register_agent("code.tester", "envs.code.env:TesterAgent")

register_env("sokoban", "envs.sokoban.env:SokobanEnv")
register_env("sudoku", "envs.sudoku.env:SudokuEnv")
register_env("plan_path", "envs.plan_path.env:PlanPathEnv")
register_agent("games.tool_agent", "envs.games_common.agents:ToolAgent")
register_agent("games.plan_agent", "envs.games_common.agents:PlanAgent")
