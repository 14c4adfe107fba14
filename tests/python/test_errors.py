"""Every error path raises layerstream.Error (the subclass of its status) with the
engine's own message: the C library's ls_engine_last_error / ls_last_error, read here
again through ctypes to check the text is the library's, not the binding's."""
import ctypes
import os

import numpy as np
import pytest

import layerstream
from conftest import SIGMA


def raises(cls, status, fragment, fn, *args, **kw):
    with pytest.raises(cls) as ei:
        fn(*args, **kw)
    e = ei.value
    assert isinstance(e, layerstream.Error) and isinstance(e, RuntimeError)
    assert e.status == status, (e.status, str(e))
    assert fragment in str(e), str(e)
    return str(e)


def test_unknown_preset():
    msg = raises(layerstream.InvalidArgument, "invalid_argument", "nope", layerstream.Engine, preset="nope")
    assert "tiny" in msg  # the engine names the presets it knows


def test_missing_checkpoint(tmp_path):
    raises(layerstream.NotFound, "not_found", str(tmp_path / "none.safetensors"), layerstream.Engine,
           model=str(tmp_path / "none.safetensors"))


def test_bad_device():
    raises(layerstream.InvalidArgument, "invalid_argument", "unknown device 'tpu'", layerstream.Engine,
           preset="tiny", device="tpu")


def test_vram_budget_on_cpu():
    raises(layerstream.InvalidArgument, "invalid_argument", "CPU backend has no device memory", layerstream.Engine,
           preset="tiny", vram_budget="1G")


def test_prefetch_values():
    raises(layerstream.InvalidArgument, "invalid_argument", "prefetch must be True, False or 'always'",
           layerstream.Engine, preset="tiny", prefetch="sometimes")
    raises(layerstream.InvalidArgument, "invalid_argument", "prefetch must be True, False or 'always'",
           layerstream.Engine, preset="tiny", prefetch=2)
    # prefetch is a vram budget's choice: without one it is refused, never ignored (the
    # CLI's --no-prefetch / --keep-prefetch likewise; tests/data/memory_doors.json).
    for given in (True, False, "always", "off", "auto"):
        raises(layerstream.InvalidArgument, "invalid_argument", "goes with vram_budget", layerstream.Engine,
               preset="tiny", prefetch=given)
        layerstream.validate_memory(vram_budget="1G", prefetch=given)


def test_budget_too_small_names_minimum(clip, inputs):
    video, audio, text = inputs
    e = layerstream.Engine(preset="tiny", activation_budget=1024)
    msg = raises(layerstream.OutOfBudget, "out_of_budget", "the smallest budget that works is", e.denoise, clip,
                 video, audio, SIGMA, text=text)
    assert "1024 bytes" in msg
    raises(layerstream.OutOfBudget, "out_of_budget", "the smallest budget that works is", e.plan, clip, SIGMA)


def test_bad_shapes(engine, clip, inputs):
    video, audio, text = inputs
    raises(layerstream.InvalidArgument, "invalid_argument", "video_tensor has shape [%d, %d, %d, %d]" % (
        video.shape[0], video.shape[1], video.shape[2], video.shape[3] - 1), engine.denoise, clip,
        video[..., :-1], audio, SIGMA, text=text)
    raises(layerstream.InvalidArgument, "invalid_argument", "audio_tensor has shape", engine.denoise, clip, video,
           audio[:-1], SIGMA, text=text)
    raises(layerstream.InvalidArgument, "invalid_argument", "leading dimensions of size 1", engine.denoise, clip,
           video, np.stack([audio, audio]), SIGMA, text=text)
    # wrong counts: text with another number of tokens than the clip's
    raises(layerstream.InvalidArgument, "invalid_argument", "text_tensor has shape [%d, " % (text.shape[0] - 1),
           engine.denoise, clip, video, audio, SIGMA, text=text[1:])
    # an output of the wrong size
    raises(layerstream.InvalidArgument, "invalid_argument", "video_out_tensor has shape", engine.denoise, clip,
           video, audio, SIGMA, text=text, video_out=np.empty(video.shape[1:], np.float32))
    # a keyframe whose latent is not the clip's width
    bad = layerstream.Clip(22, 64, 64, 8, keyframes=[layerstream.Keyframe(0, video[:, :1, :, :-1].copy())])
    raises(layerstream.Error, "invalid_argument", "keyframe", engine.denoise, bad, video, audio, SIGMA, text=text)
    # a mask of the wrong shape
    bad = layerstream.Clip(22, 64, 64, 8, video_mask=np.ones((1, 2, 3), np.float32))
    raises(layerstream.InvalidArgument, "invalid_argument", "video_mask has shape [1, 2, 3]", engine.denoise, bad,
           video, audio, SIGMA, text=text)


def test_bad_clip(engine, inputs):
    video, audio, text = inputs
    raises(layerstream.InvalidArgument, "invalid_argument", "multiples of 32", engine.denoise,
           layerstream.Clip(22, 65, 64, 8), video, audio, SIGMA, text=text)
    raises(layerstream.InvalidArgument, "invalid_argument", "text_tags has 3 entries", engine.denoise,
           layerstream.Clip(22, 64, 64, 8, text_tags=[1, 1, 0]), video, audio, SIGMA, text=text)


def test_required_and_dtypes(engine, clip, inputs):
    video, audio, text = inputs
    raises(layerstream.InvalidArgument, "invalid_argument", "give text (raw states) or refined_text", engine.denoise,
           clip, video, audio, SIGMA)
    raises(layerstream.InvalidArgument, "invalid_argument", "give float32", engine.denoise, clip,
           video.astype(np.float64), audio, SIGMA, text=text)
    raises(layerstream.InvalidArgument, "invalid_argument", "expected an array", engine.denoise, clip, "video",
           audio, SIGMA, text=text)
    ro = np.empty(video.shape, np.float32)
    ro.flags.writeable = False
    raises(layerstream.InvalidArgument, "invalid_argument", "must be writable", engine.denoise, clip, video, audio,
           SIGMA, text=text, video_out=ro)
    raises(layerstream.InvalidArgument, "invalid_argument", "not a bf16 value (element 1)", engine.denoise,
           clip, video, audio, SIGMA,
           refined_text=np.array([0.5, 1 + 2 ** -10] + [0.0] * (8 * engine.info()["hidden"] - 2),
                                 np.float32).reshape(8, -1))


def test_numerics_refused():
    raises(layerstream.Unsupported, "unsupported", "no cuDNN attention", layerstream.Engine, preset="tiny",
           numerics={"attention": "cudnn"})
    raises(layerstream.Unsupported, "unsupported", "no Hopper attention kernel", layerstream.Engine, preset="tiny",
           numerics={"attention": "hopper"})
    raises(layerstream.InvalidArgument, "invalid_argument", "kv_tile", layerstream.Engine, preset="tiny",
           numerics={"kv_tile": -1})
    raises(layerstream.InvalidArgument, "invalid_argument", "not one of", layerstream.Engine, preset="tiny",
           numerics={"attention": "flash"})
    raises(layerstream.InvalidArgument, "invalid_argument", "unknown key", layerstream.Engine, preset="tiny",
           numerics={"tile": 8})
    # The library's size grammar (ls_parse_size): decimal units are refused by name.
    raises(layerstream.InvalidArgument, "invalid_argument", "decimal units (KB, MB, GB, TB) are not accepted",
           layerstream.Engine, preset="tiny", activation_budget="12GB")


def test_report_before_any_call():
    e = layerstream.Engine(preset="tiny")
    raises(layerstream.NotFound, "not_found", "no report", e.report)
    assert e.output_hash == 0
    e.close()
    raises(layerstream.InvalidArgument, "invalid_argument", "closed", e.info)


def test_message_is_the_librarys():
    """The text raised equals ls_last_error() after the same failing ls_engine_create in C."""
    with pytest.raises(layerstream.Error) as ei:
        layerstream.Engine(preset="nope")
    so_dir = os.path.dirname(os.path.dirname(os.path.abspath(layerstream._C.__file__)))
    libs = sorted(f for f in os.listdir(os.path.dirname(so_dir)) if f.startswith("liblayerstream.so"))
    assert libs, "liblayerstream.so not found beside the build tree's python/"
    lib = ctypes.CDLL(os.path.join(os.path.dirname(so_dir), libs[0]))

    class Params(ctypes.Structure):
        _fields_ = [("size", ctypes.c_uint32), ("model_path", ctypes.c_char_p), ("preset", ctypes.c_char_p)]

    lib.ls_engine_params_init.argtypes = [ctypes.c_void_p]
    buf = ctypes.create_string_buffer(4096)
    lib.ls_engine_params_init(buf)
    p = ctypes.cast(buf, ctypes.POINTER(Params)).contents
    name = ctypes.c_char_p(b"nope")
    p.preset = name
    out = ctypes.c_void_p()
    lib.ls_engine_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.ls_last_error.restype = ctypes.c_char_p
    assert lib.ls_engine_create(buf, ctypes.byref(out)) == 1  # LS_INVALID_ARGUMENT
    assert lib.ls_last_error().decode() == str(ei.value)
