"""log_with names as Accelerate takes them: every tracker hpc adds by its name and by "all" (the trackers running
through a job of two attempts: tests/test_trackers.py)."""

from hpc.runtime.tracking import trackers as tracking

NEW = {"comet_ml": tracking.CometMLTracker, "aim": tracking.AimTracker, "clearml": tracking.ClearMLTracker,
       "dvclive": tracking.DVCLiveTracker}


def need(name):
    # every tracker's library is in the test extra: a missing one is a broken install, never a skip
    assert tracking.installed(name), f"{name} is not installed: pip install -e '.[test]'"


def test_new_trackers_by_their_log_with_names_and_by_all():
    everything = tracking.resolve(["all"])
    for name, cls in NEW.items():
        assert cls.name == name and getattr(tracking, cls.__name__) is cls
        need(name)
        assert tracking.resolve([name]) == [tracking.JsonlTracker, cls] and cls in everything
    import hpc.tracking

    assert {cls.__name__ for cls in NEW.values()} <= set(hpc.tracking.__all__)
