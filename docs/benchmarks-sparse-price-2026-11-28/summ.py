import json, sys, glob
for f in sorted(glob.glob(sys.argv[1])):
    d = json.load(open(f))
    for r in d['runs']:
        trail = r['info'].get('trail', [])
        plans = []
        for t in trail:
            spec = t['layers'].get('table.weight', [None])[0] if 'table.weight' in t.get('layers', {}) else None
            if spec and (not plans or plans[-1][1] != spec):
                plans.append((t['step'], spec.split(',')[0]))
        print(f"{f.split('/')[-1]:28} {d['code_digest']} {r['method']:8} {r['rate']:8} s{r['seed']} loss {r['valid_loss']:.4f} steps {r['steps']:4} med {r['median_step_s']:.3f} table {plans}")
