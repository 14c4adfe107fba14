/* The installed package's consumer: opens the tiny preset through the installed
 * library and prints the model's width (ctest api_install_consumer). */
#include <stdio.h>

#include <layerstream/layerstream.h>

int main(void) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  ls_engine* e = NULL;
  if (ls_engine_create(&p, &e) != LS_OK) {
    fprintf(stderr, "consumer: %s\n", ls_last_error());
    return 1;
  }
  ls_model_info m;
  ls_model_info_init(&m);
  const ls_status s = ls_engine_model_info(e, &m);
  printf("%s; hidden %lld\n", ls_version(), (long long)m.hidden);
  ls_engine_free(e);
  return s == LS_OK && m.hidden > 0 ? 0 : 1;
}
