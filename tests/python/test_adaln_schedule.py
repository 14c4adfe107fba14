"""AdaLN tables once per schedule (issue 25): with clip.sample_sigmas (ComfyUI's
transformer_options["sample_sigmas"]) the first denoise call computes the tables of every
sigma of the schedule, later calls at its sigmas keep them (no AdaLN weight is read again),
a sigma outside it computes its own (with the schedule's), a new schedule recomputes; and
every output is the same bytes as a fresh engine's call without a schedule."""
import numpy as np

import layerstream
from conftest import FRAMES, HEIGHT, TOKENS, WIDTH

SCHEDULE = [1.0, 0.85, 0.6, 0.3, 0.0]


def fresh(clip_kw, video, audio, text, sigma):
    """One call on a new engine, no schedule: the tables of this sigma alone."""
    e = layerstream.Engine(preset="tiny")
    v, a = e.denoise(layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, **clip_kw), video, audio, sigma, text=text)
    return v.tobytes() + a.tobytes()


def test_tables_are_computed_once_per_schedule_and_bytes_do_not_change(inputs):
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, sample_sigmas=SCHEDULE)
    computed = []
    for sigma in SCHEDULE[:-1]:
        v, a = e.denoise(clip, video, audio, sigma, text=text)
        rep = e.report()
        computed.append(rep["adaln"]["tables_computed"])
        assert rep["adaln"]["sigmas"] == len(SCHEDULE) - 1  # the schedule's positive sigmas
        assert v.tobytes() + a.tobytes() == fresh({}, video, audio, text, sigma), sigma
    assert computed == [True, False, False, False], computed
    # a second run over the same schedule keeps them too
    e.denoise(clip, video, audio, SCHEDULE[0], text=text)
    assert e.report()["adaln"]["tables_computed"] is False


def test_a_sigma_outside_the_schedule_computes_its_own(inputs):
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, sample_sigmas=SCHEDULE)
    e.denoise(clip, video, audio, SCHEDULE[1], text=text)
    assert e.report()["adaln"]["tables_computed"] is True
    v, a = e.denoise(clip, video, audio, 0.45, text=text)  # between two schedule sigmas (a 2nd-order sampler)
    rep = e.report()
    assert rep["adaln"]["tables_computed"] is True and rep["adaln"]["sigmas"] == len(SCHEDULE)
    assert v.tobytes() + a.tobytes() == fresh({}, video, audio, text, 0.45)
    e.denoise(clip, video, audio, SCHEDULE[2], text=text)  # the held tables cover the schedule: kept
    assert e.report()["adaln"]["tables_computed"] is False
    # another schedule: computed again
    other = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, sample_sigmas=[0.95, 0.5, 0.0])
    e.denoise(other, video, audio, 0.95, text=text)
    assert e.report()["adaln"]["tables_computed"] is True


def test_without_a_schedule_each_call_has_its_own_tables(inputs):
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS)
    e.denoise(clip, video, audio, 0.7, text=text)
    assert e.report()["adaln"] == {"tables_computed": True, "sigmas": 1, "schedule": False}
    e.denoise(clip, video, audio, 0.7, text=text)  # the same sigma again: the held tables are its own
    assert e.report()["adaln"]["tables_computed"] is False
    e.denoise(clip, video, audio, 0.5, text=text)
    assert e.report()["adaln"]["tables_computed"] is True


def test_the_schedule_matches_by_timestep_not_by_float(inputs):
    """ComfyUI hands the wrapper fl32(sigma * 1000); the sigma the node recovers from it need
    not be the schedule's float, but its timestep is, and so are its tables."""
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, sample_sigmas=SCHEDULE)
    e.denoise(clip, video, audio, SCHEDULE[1], text=text)
    s = np.float32(SCHEDULE[2])
    near = [x for x in (np.nextafter(s, np.float32(1)), np.nextafter(s, np.float32(0)))
            if np.float32(x * np.float32(1000)) == np.float32(s * np.float32(1000))]
    for x in near:  # a neighbour with the same timestep, where one exists
        e.denoise(clip, video, audio, float(x), text=text)
        assert e.report()["adaln"]["tables_computed"] is False
    e.denoise(clip, video, audio, SCHEDULE[2], text=text)
    assert e.report()["adaln"]["tables_computed"] is False


def test_the_device_peak_of_every_call_is_the_first_calls(inputs):
    """Issue 25's budget overrun, on the CPU backend's counted memory: a later call refined the
    text and computed its AdaLN tables while the activation arena of the previous call was
    still held, so its peak was the first call's plus those (the planner counts them as
    separate peaks). Raw text (refined at every call) and a new sigma per call (tables at
    every call): every call's device peak is a fresh engine's."""
    video, audio, text = inputs
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS)
    e = layerstream.Engine(preset="tiny")
    peaks = []
    for sigma in (0.9, 0.7, 0.5, 0.3):
        e.denoise(clip, video, audio, sigma, text=text)
        rep = e.report(output_hash=False)
        assert rep["adaln"]["tables_computed"] is True
        peaks.append(rep["device_peak_bytes"])
    f = layerstream.Engine(preset="tiny")
    f.denoise(clip, video, audio, 0.3, text=text)
    first = f.report(output_hash=False)["device_peak_bytes"]
    assert first > 0
    assert peaks == [first] * len(peaks), (peaks, first)
