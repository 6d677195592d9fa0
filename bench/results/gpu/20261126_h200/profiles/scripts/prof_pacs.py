import sys, time, torch
sys.path.insert(0, '.')
from pacs_fast.ops.pacs_loss import fused_pacs_loss
from torch.profiler import profile, ProfilerActivity
B, T, G = 1024, 4096, 8
d = 'cuda'
logp = (-torch.rand(B, T, device=d) * 3).requires_grad_(True)
ref = -torch.rand(B, T, device=d) * 3
mask = torch.rand(B, T, device=d) > 0.2
R = (torch.rand(B, device=d) > 0.5).float()
def once():
    logp.grad = None
    l = fused_pacs_loss(logp, ref, mask, R, group_size=G)
    l.backward()
for _ in range(3): once()
torch.cuda.synchronize()
ts = []
for _ in range(20):
    torch.cuda.synchronize(); t0 = time.perf_counter(); once(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
print('wall median ms', sorted(ts)[10] * 1e3)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(5): once()
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by='cuda_time_total', row_limit=25))
print(p.key_averages().table(sort_by='cpu_time_total', row_limit=25))
