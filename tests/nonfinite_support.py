"""An env with the bug a fresh model exposes: its team reward is NaN on unparseable output.

It is ``toy_targets`` (agents alice and bob each write text rich in their own target character), except that an
answer without a single target character does not parse and turns the team reward into NaN, as a ``0 / 0`` on a
failed parse would. Its reset state (no answers yet) has a finite reward, so only states reached by stepping an
unparseable output show the bug.
"""

from __future__ import annotations

from pettingllms.envs.toy.env import TargetsEnv, target_score


class NaNOnGarbageEnv(TargetsEnv):
    def team_reward(self, state) -> float:
        if any(target_score(state.answer(a), t) == 0.0 for a, t in state.targets if state.answer(a) is not None):
            return float("nan")
        return super().team_reward(state)
