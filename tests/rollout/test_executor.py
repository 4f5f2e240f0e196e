"""AT-GRPO tree sampling, proven with scripted policies on the toy env (no model involved)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from pettingllms.envs.toy.env import TargetsEnv, target_score
from pettingllms.core import Problem, PromptTooLongError
from pettingllms.core.checker import _mutable_ids

BRANCH_TEXTS = ["aaaa", "abab", "bbbb", "xyzw"]


def by_branch(prompt: str, k: int, request) -> str:
    """Candidate k always writes BRANCH_TEXTS[k]: every node's K candidates differ."""
    return BRANCH_TEXTS[k % len(BRANCH_TEXTS)]


def problems(n: int) -> list[Problem]:
    return [Problem(f"q{i}", {"prompt": f"task {i}"}) for i in range(n)]


def test_every_group_has_exactly_k_samples(make_executor):
    env = TargetsEnv(max_turns=3, threshold=2.0)  # threshold 2: never terminates, all turns run
    executor, _ = make_executor(env, by_branch, branching=4)
    result = executor.run(problems(3), seeds=[0, 1, 2])
    sizes = Counter(s.group for s in result.samples)
    assert len(sizes) == 3 * 3 * 2  # problems x turns x agents
    assert set(sizes.values()) == {4}


def test_later_agent_in_a_turn_gets_non_degenerate_rewards(make_executor):
    # The reference selected the best branch inside the per-agent loop, so bob (second in the turn) was
    # scored on K copies of alice's choice and every reward in his group was equal.
    env = TargetsEnv(max_turns=2, threshold=2.0)
    executor, _ = make_executor(env, by_branch, branching=4)
    result = executor.run(problems(1), seeds=[0])
    for turn in range(2):
        bob = [s.reward for s in result.samples if s.agent == "bob" and s.turn == turn]
        assert len(set(bob)) > 1, f"bob's rewards at turn {turn} are degenerate: {bob}"
        # each candidate is scored on its own post-step state: local + alpha * team by hand
        alice_text = "aaaa"  # greedy picks alice's best branch: all 'a'
        for s in result.samples:
            if s.agent == "bob" and s.turn == turn:
                local = target_score(s.response_text, "b")
                team = (target_score(alice_text, "a") + local) / 2
                assert s.reward == pytest.approx(local + team)


def test_scores_come_from_the_stepped_state_and_history_advances(make_executor):
    # The reference stepped one set of env objects and scored another, so prompts showed a frozen history.
    env = TargetsEnv(max_turns=3, threshold=2.0)
    seen_prompts = defaultdict(list)

    def script(prompt, k, request):
        seen_prompts[request.request_id].append(prompt)
        return BRANCH_TEXTS[k]

    executor, _ = make_executor(env, script, branching=4)
    executor.run(problems(1), seeds=[0])
    alice_t1 = seen_prompts["p0/t001/alice"][0]
    alice_t2 = seen_prompts["p0/t002/alice"][0]
    assert "bob said: bbbb" in alice_t1  # bob's greedy choice at turn 0 is visible at turn 1
    assert "bob said: bbbb" in alice_t2


def test_episode_ends_when_the_chosen_branch_terminates(make_executor):
    env = TargetsEnv(max_turns=5, threshold=1.0)
    executor, _ = make_executor(env, by_branch, branching=4)
    result = executor.run(problems(2), seeds=[0, 1])
    for episode in result.episodes:
        assert episode.terminated and not episode.truncated and episode.success
        assert episode.turns == 1  # alice picks "aaaa", bob picks "bbbb": solved in turn 0
    assert {s.turn for s in result.samples} == {0}


def test_episode_runs_to_max_turns_when_never_solved(make_executor):
    env = TargetsEnv(max_turns=3, threshold=1.0)
    executor, _ = make_executor(env, lambda p, k, r: "zzzz", branching=2)
    result = executor.run(problems(1), seeds=[0])
    episode = result.episodes[0]
    assert episode.turns == 3 and episode.truncated and not episode.terminated and not episode.success


def test_branch_states_never_share_objects():
    env = TargetsEnv(max_turns=2)
    state = env.reset(problems(1)[0], seed=0)
    branches = [env.step(state, "alice", text).state for text in BRANCH_TEXTS]
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            assert not (_mutable_ids(branches[i]) & _mutable_ids(branches[j]))
        assert branches[i].answer("alice") == BRANCH_TEXTS[i]
    assert state.answers == ()  # the parent is untouched


def test_group_ids_never_merge_problems(make_executor):
    # The reference's key (env_idx // K, turn, agent) merged K problems into one group. Two slots holding the
    # *same* problem must still be two groups.
    env = TargetsEnv(max_turns=1, threshold=2.0)
    executor, _ = make_executor(env, by_branch, branching=4)
    same = Problem("dup", {"prompt": "same"})
    result = executor.run([same, same, *problems(2)], seeds=[0, 0, 1, 2])
    groups = defaultdict(set)
    for s in result.samples:
        groups[s.group].add(s.episode)
    assert len(groups) == 4 * 2
    assert all(len(episodes) == 1 for episodes in groups.values())


def test_all_requests_of_a_policy_go_in_one_call(make_executor):
    env = TargetsEnv(max_turns=1, threshold=2.0, parallel=True)
    executor, engines = make_executor(env, by_branch, branching=4)
    executor.run(problems(5), seeds=list(range(5)))
    calls = engines["policy_0"].calls
    assert len(calls) == 1  # one parallel stage, one turn: every episode's requests batched together
    assert len(calls[0]) == 5 * 2 and all(r.n == 4 for r in calls[0])


def test_two_policies_get_their_own_agents_requests(make_executor):
    env = TargetsEnv(max_turns=1, threshold=2.0, parallel=True)
    executor, engines = make_executor(env, by_branch, policies={"alice": "pa", "bob": "pb"}, branching=2)
    result = executor.run(problems(2), seeds=[0, 1])
    assert {r.request_id.split("/")[-1] for r in engines["pa"].calls[0]} == {"alice"}
    assert {r.request_id.split("/")[-1] for r in engines["pb"].calls[0]} == {"bob"}
    assert {(s.agent, s.policy) for s in result.samples} == {("alice", "pa"), ("bob", "pb")}


def test_independent_mode_groups_k_episodes_by_problem_turn_agent(make_executor):
    env = TargetsEnv(max_turns=2, threshold=2.0)
    calls = Counter()

    def script(prompt, k, request):
        calls[request.request_id] += 1
        return BRANCH_TEXTS[int(request.request_id.split("e")[1].split("/")[0]) % 4]

    executor, _ = make_executor(env, script, mode="independent", branching=4)
    result = executor.run(problems(2), seeds=[0, 1])
    assert all(n == 1 for n in calls.values())  # n=1 per request in independent mode
    sizes = Counter(s.group for s in result.samples)
    assert set(sizes.values()) == {4} and len(sizes) == 2 * 2 * 2
    assert len(result.episodes) == 8
    alice_t0 = [s.reward for s in result.samples if s.group == (0, 0, "alice")]
    assert len(set(alice_t0)) > 1


def test_validation_runs_independent_episodes(make_executor):
    env = TargetsEnv(max_turns=1, threshold=2.0)
    executor, engines = make_executor(env, by_branch, mode="tree", branching=4)
    result = executor.run(problems(3), seeds=[0, 1, 2], validation=True, n=2)
    assert len(result.episodes) == 6
    assert all(r.n == 1 for call in engines["policy_0"].calls for r in call)


@pytest.mark.parametrize("select,expected", [("greedy", "aaaa"), ("first", "aaaa"), ("sample", None)])
def test_selection_rules(make_executor, select, expected):
    env = TargetsEnv(max_turns=1, threshold=2.0, targets={"alice": "b"})
    texts = ["aaaa", "bbbb", "abab", "bbbb"]  # best for target 'b': index 1 and 3 tie -> greedy takes 1
    executor, _ = make_executor(env, lambda p, k, r: texts[k], branching=4, select=select)
    result = executor.run(problems(1), seeds=[0])
    chosen = [s for s in result.samples if s.chosen]
    assert len(chosen) == 1
    if select == "greedy":
        assert chosen[0].branch == 1
    elif select == "first":
        assert chosen[0].branch == 0
    else:
        again = executor.run(problems(1), seeds=[0])
        assert [s.branch for s in again.samples if s.chosen] == [chosen[0].branch]  # deterministic per seed


def test_failed_generations_are_flagged_and_never_chosen(make_executor):
    env = TargetsEnv(max_turns=1, threshold=2.0, targets={"alice": "a"})
    # an empty completion counts as a failed generation
    executor, _ = make_executor(env, lambda p, k, r: "" if k == 0 else "ab", branching=3)
    result = executor.run(problems(1), seeds=[0])
    failed = [s for s in result.samples if s.failed]
    assert [s.branch for s in failed] == [0]
    assert failed[0].reward == 0.0 and not failed[0].chosen


def test_rollout_is_deterministic(make_executor):
    env = TargetsEnv(max_turns=2, threshold=2.0)
    ex, _ = make_executor(env, by_branch, branching=4, select="sample")
    a = ex.run(problems(4), seeds=[5, 6, 7, 8])
    b = ex.run(problems(4), seeds=[5, 6, 7, 8])
    def key(r):
        return [(s.group, s.branch, s.response_ids, s.reward, s.chosen) for s in r.samples]

    assert key(a) == key(b)


def test_first_turn_prompt_too_long_is_a_clear_error(make_executor):
    env = TargetsEnv(max_turns=1)
    executor, _ = make_executor(env, by_branch, branching=2, max_prompt_length=10)
    with pytest.raises(PromptTooLongError, match="max_prompt_length=10"):
        executor.run(problems(1), seeds=[0])


def test_a_crashing_env_names_the_problem(make_executor):
    from pettingllms.core import EnvError

    class Crashing(TargetsEnv):
        def step(self, state, agent, action):
            raise ZeroDivisionError("boom")

    executor, _ = make_executor(Crashing(max_turns=1), by_branch, branching=2)
    with pytest.raises(EnvError, match=r"problem 'q0'.*agent 'alice'.*boom"):
        executor.run(problems(1), seeds=[0])


class InfoTargetsEnv(TargetsEnv):
    """Reports each action's length and a label in ``Transition.info``."""

    def step(self, state, agent, action):
        transition = super().step(state, agent, action)
        transition.info = {"chars": len(str(action)), "label": f"{agent}:{action}"}
        return transition


def test_transition_info_reaches_samples_records_and_metrics(make_executor):
    from pettingllms.trainer.metrics import sample_metrics

    executor, _ = make_executor(InfoTargetsEnv(max_turns=1, threshold=2.0), lambda p, k, r: "a" * (k + 1),
                                branching=3)
    result = executor.run(problems(2), seeds=[0, 1])
    for s in result.samples:
        assert s.info == {"chars": len(s.response_text), "label": f"{s.agent}:{s.response_text}"}
    for episode in result.episodes:
        for entry in episode.transcript:  # the chosen branch's info
            assert entry["info"]["chars"] == len(entry["response"])
    metrics = sample_metrics(result.samples)
    assert metrics["policy_0/alice/info/chars_mean"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3 per node
    assert not any("label" in key for key in metrics)  # labels stay in the records
