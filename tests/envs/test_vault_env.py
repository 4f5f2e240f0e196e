"""The vault env: neither agent can open the vault alone; the code is the opener's half, then the reader's."""

from __future__ import annotations

from pettingllms.envs.vault.env import OPENER, READER, Opener, Reader, VaultEnv, last_number, make_problem, parse_code


def test_problems_are_deterministic_and_train_and_test_never_overlap():
    env = VaultEnv()
    assert make_problem(5) == make_problem(5)
    train = {p.problem_id for p in env.procedural_problems("train", 200)}
    test = {p.problem_id for p in env.procedural_problems("test", 200)}
    assert len(train) == len(test) == 200 and not train & test
    card = make_problem(3).data["card"]
    assert card.count(",") == 2 and f"code {make_problem(3).data['reader_half']}" in card


def test_the_vault_opens_only_with_the_opener_half_first_then_the_relayed_half():
    env = VaultEnv(max_turns=2)
    problem = make_problem(11)
    state = env.reset(problem, 0)
    a, b = state.reader_half, state.opener_half
    relayed = env.step(state, READER, Reader(READER).parse(f"My code is {a}.")).state
    assert Reader(READER).local_reward(relayed) == 1.0 and relayed.relayed == a
    wrong = env.step(relayed, OPENER, Opener(OPENER).parse(f"CODE: {a}{b}"))  # reading order: the common mistake
    assert not wrong.terminated and env.team_reward(wrong.state) == 0.0
    right = env.step(relayed, OPENER, Opener(OPENER).parse(f"Sure. CODE: {b}{a}"))
    assert right.terminated and env.success(right.state) and env.team_reward(right.state) == 1.0
    assert relayed.attempt is None  # steps are pure: the input state is untouched


def test_the_opener_sees_only_the_message_and_a_failed_try_is_shown_next_turn():
    env = VaultEnv(max_turns=2)
    state = env.reset(make_problem(2), 0)
    state = env.step(state, READER, "My code is 12.").state
    prompt = Opener(OPENER).observe(state, 0)[-1]["content"]
    assert "Partner: My code is 12." in prompt and state.card not in prompt and str(state.opener_half) in prompt
    failed = env.step(state, OPENER, "4242").state
    assert "Your last try, CODE: 4242, did not open the vault." in Opener(OPENER).observe(failed, 1)[-1]["content"]
    assert "Your partner typed CODE: 4242 and the vault stayed shut." in Reader(READER).observe(failed, 1)[-1]["content"]


def test_parsers_take_the_last_code_and_number_and_never_raise():
    assert parse_code("CODE: 12 then CODE: 3456") == "3456" and parse_code("no code") == "" and parse_code(None) == ""
    assert last_number("room 3, code 47") == 47 and last_number("none") is None and last_number(None) is None


def test_one_player_holds_both_halves_and_opens_alone():
    from pettingllms.envs.vault.env import SOLO, Solo

    env = VaultEnv(max_turns=2, players=1)
    assert env.graph.agents == (SOLO,) or list(env.graph.agents) == [SOLO]
    state = env.reset(make_problem(4), 0)
    prompt = Solo(SOLO).observe(state, 0)[-1]["content"]
    assert state.card in prompt and str(state.opener_half) in prompt
    assert env.step(state, SOLO, Solo(SOLO).parse(f"CODE: {state.code}")).terminated
    import pytest

    with pytest.raises(ValueError, match="players must be 1"):
        VaultEnv(players=3)
