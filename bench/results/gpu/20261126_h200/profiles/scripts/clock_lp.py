import sys, time, statistics, subprocess, torch
sys.path.insert(0, '.')
from pacs_fast.ops.linear_logprobs import linear_logprobs
n, h, v = 8192, 4096, 151936
g = torch.Generator(device='cpu').manual_seed(0)
hid = torch.randn(n, h, generator=g).cuda().bfloat16()
w = (torch.randn(v, h, generator=g) / h ** 0.5 * 2).cuda().bfloat16()
y = torch.randint(0, v, (n,), generator=g).cuda()
z = torch.empty(n, v, dtype=torch.bfloat16, device='cuda')
f = lambda: linear_logprobs(hid, w, y, return_entropy=True, backend='triton')
gemm = lambda: torch.matmul(hid, w.T, out=z)
def ev(fn):
    a, b = torch.cuda.Event(True), torch.cuda.Event(True); a.record(); fn(); b.record(); torch.cuda.synchronize(); return a.elapsed_time(b)
def clk():
    return subprocess.run(['nvidia-smi','--query-gpu=clocks.sm,power.draw,temperature.gpu','--format=csv,noheader'],capture_output=True,text=True).stdout.strip()
with torch.no_grad():
    for _ in range(2): f(); gemm()
    torch.cuda.synchronize(); time.sleep(1)
    print('idle', clk())
    print('op alone, synced each', [round(ev(f), 2) for _ in range(6)], clk())
    time.sleep(1)
    a = torch.cuda.Event(True); b = torch.cuda.Event(True); a.record()
    for _ in range(6): f()
    b.record(); torch.cuda.synchronize(); print('op back-to-back mean', round(a.elapsed_time(b) / 6, 2), clk())
    time.sleep(1)
    print('gemm alone', [round(ev(gemm), 2) for _ in range(6)], clk())
    time.sleep(1)
    print('alternating gemm/op', [(round(ev(gemm), 2), round(ev(f), 2)) for _ in range(6)], clk())
