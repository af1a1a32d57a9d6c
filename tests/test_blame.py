"""Who a worker's death falls on (sweep/run/blame.py): a suspicion first, certainty alone."""

from sweep.run.blame import Blame


def test_a_death_makes_a_suspect_who_crashes_only_once_it_died_alone_past_the_retries():
    blame = Blame({}, max_retries=1)
    assert not blame.died(7, alone=False) and 7 in blame.suspects  # with others queued
    assert blame.died(7, alone=True)  # its second death, alone: its own
    assert 7 not in blame.suspects


def test_a_death_alone_within_the_retries_runs_the_trial_again_alone():
    blame = Blame({}, max_retries=2)
    assert not blame.died(3, alone=True) and not blame.died(3, alone=True)
    assert 3 in blame.suspects and blame.died(3, alone=True)


def test_an_earlier_sessions_deaths_count_and_a_record_clears_the_suspicion():
    blame = Blame({5: 1, 6: 1}, max_retries=1)
    assert blame.suspects == {5, 6}  # each runs alone first
    blame.finished([6])
    assert blame.suspects == {5} and blame.died(5, alone=True)
