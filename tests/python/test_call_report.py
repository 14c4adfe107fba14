"""The report a caller reads every step (issue 25): Engine.report(output_hash=False)
(ls_engine_call_report_json) is the full report without the fingerprint, which reads every
output byte (about 50 ms at S = 111k) and is computed only when asked for, once per call;
api_seconds says what the C API spent around the forward."""
import layerstream
from conftest import FRAMES, HEIGHT, SIGMA, TOKENS, WIDTH


def test_the_call_report_leaves_the_fingerprint_out_and_it_is_computed_on_request(inputs):
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS)
    v, a = e.denoise(clip, video, audio, SIGMA, text=text)
    light = e.report(output_hash=False)
    assert "output_hash" not in light
    assert light["call"] == "denoise" and light["wall_seconds"] > 0
    api = light["api_seconds"]
    assert set(api) == {"inputs", "plan", "denoise", "outside_forward"}
    assert 0 <= api["outside_forward"] and api["denoise"] >= light["wall_seconds"]
    full = e.report()
    assert int(full["output_hash"], 16) == e.output_hash == layerstream.fingerprint(v, a)
    assert {k: x for k, x in full.items() if k != "output_hash"} == light
    # a second call: the fingerprint is of its outputs, not the first call's
    v2, a2 = e.denoise(clip, video, audio, 0.3, text=text)
    assert e.output_hash == layerstream.fingerprint(v2, a2) != layerstream.fingerprint(v, a)
    assert int(e.report()["output_hash"], 16) == e.output_hash
