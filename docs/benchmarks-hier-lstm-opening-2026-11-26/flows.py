"""1 TCP flow of 2.77 MB against 2 concurrent flows of 1.38 MB through the benchmark's 200 Mbit/s tbf veth."""
import subprocess, sys, time, statistics
sys.path.insert(0, "/work/main")
from autocomp_bench.shaped_link import ShapedLink

SERVER = r'''
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 5555)); srv.listen(8)
def serve(c):
    while True:
        hdr = c.recv(8)
        if not hdr: return
        n = int.from_bytes(hdr, "big"); got = 0
        while got < n: got += len(c.recv(min(1 << 20, n - got)))
        c.sendall(b"k")
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
'''
CLIENT = r'''
import socket, sys, threading, time
host, flows, total, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = [socket.create_connection((host, 5555)) for _ in range(flows)]
each = total // flows; payload = b"x" * each
def one(s):
    s.sendall(each.to_bytes(8, "big") + payload); s.recv(1)
for r in range(reps):
    ts = [threading.Thread(target=one, args=(s,)) for s in socks]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.perf_counter() - t0
    print(f"{flows} {total} {dt:.4f} {total/dt/1e6:.2f}", flush=True)
    time.sleep(0.05)
'''
with ShapedLink(ShapedLink.Config(rate_mbit=200.0)) as link:
    ns, addr = link.namespaces, link.addresses
    srv = subprocess.Popen(["ip", "netns", "exec", ns[1], sys.executable, "-c", SERVER, addr[1]])
    time.sleep(0.5)
    try:
        for total in (2_768_896, 524_288):
            for flows in (1, 2, 1, 2):
                out = subprocess.run(["ip", "netns", "exec", ns[0], sys.executable, "-c", CLIENT, addr[1], str(flows), str(total), "8"], capture_output=True, text=True, timeout=60)
                rates = [float(l.split()[3]) for l in out.stdout.split("\n") if l.strip()]
                print(f"total {total} flows {flows}: MB/s median {statistics.median(rates[1:]):.2f} all {rates}")
    finally:
        srv.kill()
