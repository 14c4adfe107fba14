"""LayerStream for ComfyUI: the node "LayerStream: H3 Engine".

Copy or link this folder into ComfyUI/custom_nodes/ and make the `layerstream` Python
package importable by ComfyUI's Python (README "Use it from ComfyUI"). Without ComfyUI
or torch the package still imports: it logs one warning and registers nothing.

Registration: ComfyUI's loader (nodes.py load_custom_node) takes the v1 branch whenever
a module has a NODE_CLASS_MAPPINGS that is not None and then never looks at
comfy_entrypoint, so the v3 entry point below is only found when NODE_CLASS_MAPPINGS is
absent. The empty mappings exist only on the no-ComfyUI path (registers nothing, and
ComfyUI would not print "IMPORT FAILED" for it).
"""

import logging

_log = logging.getLogger("layerstream_h3")

try:
    import torch  # noqa: F401  (ComfyUI owns torch; the node needs it at run time)
    from comfy_api.latest import ComfyExtension
except ImportError as _e:  # not inside ComfyUI (tests, a plain Python): register nothing
    _log.warning("[LayerStream] ComfyUI or torch is not importable (%s); the H3 Engine node is not registered", _e)
    NODE_CLASS_MAPPINGS = {}
    NODE_DISPLAY_NAME_MAPPINGS = {}
else:
    from .node import make_node_class

    class LayerStreamExtension(ComfyExtension):
        async def get_node_list(self):
            return [make_node_class()]

    async def comfy_entrypoint():
        return LayerStreamExtension()
