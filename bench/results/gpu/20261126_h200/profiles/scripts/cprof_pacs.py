import sys, cProfile, pstats, torch
sys.path.insert(0, '.')
from pacs_fast.ops.pacs_loss import fused_pacs_loss
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
pr = cProfile.Profile(); pr.enable()
for _ in range(50): once()
torch.cuda.synchronize()
pr.disable()
s = pstats.Stats(pr); s.sort_stats('cumulative').print_stats(45)
s.sort_stats('tottime').print_stats(25)
