import sys
p=sys.argv[1]+'/src/backend/cuda/attention_int8.cu'
s=open(p).read()
old="""  const dim3 grid(static_cast<unsigned>(div_up(Mq, kWarps * 16)), static_cast<unsigned>(H));
  kernel<<<grid, kWarps * 32, kAttnSmem, ctx.stream>>>(a);"""
new="""  if (const char* c = std::getenv("LS_EXP_CARVEOUT"))  // EXPERIMENT ONLY (run18/run6.sh)
    LS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, std::atoi(c)));
  const dim3 grid(static_cast<unsigned>(div_up(Mq, kWarps * 16)), static_cast<unsigned>(H));
  kernel<<<grid, kWarps * 32, kAttnSmem, ctx.stream>>>(a);"""
assert old in s; s=s.replace(old,new)
s=s.replace("#include <algorithm>\n","#include <algorithm>\n#include <cstdlib>\n",1)
open(p,'w').write(s)
