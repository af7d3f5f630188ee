import sys, collections, re
for path in sys.argv[1:]:
    by_thread = collections.Counter(); by_func = collections.Counter(); total = 0
    for line in open(path):
        line = line.rstrip()
        if not line: continue
        stack, _, n = line.rpartition(" ")
        n = int(n); frames = stack.split(";")
        if "one.py" not in stack and "autocomp" not in stack and "torch" not in stack: continue
        if "torchrun" in frames[0] and "one.py" not in stack: continue
        total += n
        thread = frames[1] if len(frames) > 1 else "?"
        by_thread[re.sub(r"\d+", "N", thread)] += n
        ac = [f for f in frames if "autocomp/" in f or "ddp_comm_hooks" in f]
        if ac:
            by_func[ac[0].split(" (")[0] + " > " + ac[-1].split(" (")[0]] += n
    print(path, "total", total)
    for k, v in by_thread.most_common(6): print("   thread", k, v)
    for k, v in by_func.most_common(25): print("   ", v, k)
