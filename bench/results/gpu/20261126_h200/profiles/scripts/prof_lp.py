import sys, torch
sys.path.insert(0, '.')
from pacs_fast.ops.linear_logprobs import linear_logprobs
from torch.profiler import profile, ProfilerActivity
n, h, v = 8192, 4096, 151936
g = torch.Generator(device='cpu').manual_seed(0)
hid = torch.randn(n, h, generator=g).cuda().bfloat16()
w = (torch.randn(v, h, generator=g) / h ** 0.5 * 2).cuda().bfloat16()
y = torch.randint(0, v, (n,), generator=g).cuda()
f = lambda: linear_logprobs(hid, w, y, return_entropy=True, backend='triton')
with torch.no_grad():
    for _ in range(2): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3): f()
        torch.cuda.synchronize()
print(p.key_averages().table(sort_by='cuda_time_total', row_limit=18, max_name_column_width=60))
