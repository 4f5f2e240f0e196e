"""The end-of-run held-out line names both validations, or says there was only one."""

from pettingllms.trainer.trainer import validation_line


def test_two_validations_give_the_rise_in_points():
    line = validation_line("procedural", 64, [(0, 0.28125), (10, 0.5), (20, 0.53125)])
    assert line == ("held-out procedural (64 problems, validation sampling): success 0.281 at step 0 -> 0.531 at "
                    "step 20 (+25.0 points)")


def test_one_validation_is_not_reported_as_a_rise_of_zero():
    # a run with val_before_train=false printed "0.188 at step 16 -> 0.188 at step 16 (+0.0 points)"
    line = validation_line("procedural", 64, [(16, 0.1875)])
    assert "->" not in line and "points" not in line
    assert "0.188 at step 16 (one validation: training.val_before_train=true" in line
