/* Compiled by ctest (api_header_c11) with cc -std=c11 -Wall -Wextra -pedantic -Werror:
 * the public header is plain C11. Uses every params struct so a non-C type fails. */
#include <layerstream/layerstream.h>

int main(void) {
  ls_numerics n;
  ls_engine_params p;
  ls_clip c;
  ls_clip_shape s;
  ls_model_info m;
  ls_denoise_params d;
  ls_generate_params g;
  ls_keyframe k;
  ls_reference r;
  ls_tensor t;
  ls_keyframe_tensors kt;
  ls_reference_tensors rt;
  ls_memory_request mr; /* API 5 */
  ls_range rg;
  ls_clip_grid cg;
  (void)n, (void)p, (void)c, (void)s, (void)m, (void)d, (void)g, (void)k, (void)r, (void)t, (void)kt, (void)rt, (void)mr, (void)rg, (void)cg;
  return LS_OK;
}
