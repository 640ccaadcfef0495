import pytest

from tts_core.degrade import DegradeController, LoadInputs, load_score
from tts_core.errors import InvalidSetting
from tts_core.request.operating import OperatorSettings


def test_load_score_is_the_worst_pressure():
    score, parts = load_score(LoadInputs(queue_wait_s=9.0, queue_wait_limit_s=10.0, device_memory_used=0.95))
    assert score == pytest.approx(0.95) and parts == {"queue_wait": 0.9, "device_memory": 0.95}
    assert load_score(LoadInputs(30.0, 10.0, None))[0] == 1.0
    assert load_score(LoadInputs(1.5, 2.0, None))[0] == 0.75  # measured against the wait target in force


def waiting(fraction: float) -> LoadInputs:
    """A predicted queue wait of this fraction of the default 10 s target."""
    return LoadInputs(queue_wait_s=10 * fraction, queue_wait_limit_s=10.0, device_memory_used=None)


def test_hysteresis_between_enter_and_exit():
    controller = DegradeController(OperatorSettings(enter_threshold=0.8, exit_threshold=0.4, exit_hold_s=0))
    trace = [controller.update(waiting(fill)).active for fill in (0.5, 0.85, 0.6, 0.41, 0.4, 0.7)]
    assert trace == [False, True, True, True, False, False]


def test_leaving_waits_for_the_score_to_stay_calm_for_the_hold():
    now = [0.0]
    controller = DegradeController(OperatorSettings(enter_threshold=0.8, exit_threshold=0.4, exit_hold_s=5),
                                   clock=lambda: now[0])
    trace = []
    for t, fill in ((0, 0.9), (1, 0.0), (3, 0.6), (4, 0.1), (8, 0.0), (9, 0.2)):
        now[0] = t
        trace.append(controller.update(waiting(fill)).active)
    # calm at 1 s is broken at 3 s; calm again from 4 s, so it ends at 9 s, not 6 s
    assert trace == [True, True, True, True, True, False]


def test_the_expected_end_is_the_drain_to_the_exit_threshold_then_the_hold():
    now = [0.0]
    controller = DegradeController(OperatorSettings(enter_threshold=0.8, exit_threshold=0.4, exit_hold_s=5),
                                   clock=lambda: now[0])
    assert controller.expected_end_s() == 0  # not degraded
    controller.update(waiting(0.9))
    # 9 s of predicted wait must drain to 4 s (the exit threshold of the 10 s target), then 5 s of calm
    assert controller.expected_end_s() == pytest.approx(5 + 5)
    now[0] = 2.0
    controller.update(waiting(0.1))  # calm from 2 s: only the rest of the hold is left
    now[0] = 4.0
    assert controller.expected_end_s() == pytest.approx(3)


def test_an_operator_change_applies_at_once_without_the_hold():
    settings = OperatorSettings(enter_threshold=0.8, exit_threshold=0.4, exit_hold_s=60)
    controller = DegradeController(settings)
    assert controller.update(waiting(0.85)).active
    controller.configure(settings.merged({"enter_threshold": 1.0, "exit_threshold": 0.9}))
    assert not controller.state.active


def test_actions_follow_the_switches():
    settings = OperatorSettings(shed_enabled=True, lower_precision_enabled=False)
    controller = DegradeController(settings)
    assert controller.update(waiting(1.0)).actions == ("cap_text", "cache_first", "shed")
    controller.configure(settings.merged({"degrade_enabled": False}))
    assert controller.state.actions == () and not controller.state.active


@pytest.mark.parametrize("changes, field", [
    ({"cap_text_chars": -5}, "cap_text_chars"),
    ({"enter_threshold": 0.5, "exit_threshold": 0.5}, "exit_threshold"),
    ({"exit_threshold": 0.9}, "exit_threshold"),
    ({"turbo": True}, "turbo"),
    ({"cache_enabled": "yes"}, "cache_enabled"),
    ({"cap_text_chars": 12.5}, "cap_text_chars"),
    ({"enter_threshold": 2}, "enter_threshold"),
])
def test_invalid_changes_name_the_field(changes, field):
    with pytest.raises(InvalidSetting) as raised:
        OperatorSettings().merged(changes)
    assert raised.value.param == field


def test_stored_values_override_defaults_and_bad_ones_are_skipped_and_reported():
    settings, ignored = OperatorSettings.from_stored({"cap_text_chars": 120, "enter_threshold": "high", "gone": 1})
    assert settings.cap_text_chars == 120 and settings.enter_threshold == OperatorSettings().enter_threshold
    assert set(ignored) == {"enter_threshold", "gone"}


def test_stored_values_apply_together_whatever_their_order():
    # enter 0.5 alone would clash with the default exit 0.6; with exit 0.2 beside it, it is valid.
    settings, ignored = OperatorSettings.from_stored({"enter_threshold": 0.5, "exit_threshold": 0.2})
    assert (settings.enter_threshold, settings.exit_threshold) == (0.5, 0.2) and ignored == {}
