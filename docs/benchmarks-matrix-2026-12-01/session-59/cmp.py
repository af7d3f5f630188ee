"""Two tta matrices side by side: per method the median step ratio new/old over the cells,
per cell adaptive's loss, steps, excess, step-100 time, opening and boundary seconds, and the
checks passed by kind with the misses listed.
  python docs/benchmarks-matrix-2026-12-01/session-59/cmp.py OLD.json NEW.json"""
import json, sys, statistics
from collections import defaultdict
def load(f):
    d=json.load(open(f)); t=defaultdict(dict)
    for x in d['runs']: t[(x['task'],x['rate'])][x['method']]=x
    return d,t
old_d,old=load(sys.argv[1]); new_d,new=load(sys.argv[2])
for m in ('allreduce','fp16','powersgd','limit','adaptive','oracle'):
    r=[new[k][m]['median_step_s']/old[k][m]['median_step_s'] for k in new if m in new[k] and m in old.get(k,{})]
    print(m,'step ratio new/old median %.3f'%statistics.median(r))
for k in new:
    a=new[k]['adaptive']; s=dict((x,y) for x,y in a['step_time_spread']['slowest'])
    ao=old[k]['adaptive']; so=dict((x,y) for x,y in ao['step_time_spread']['slowest'])
    print(k,'loss %.4f (old %.4f)'%(a['valid_loss'],ao['valid_loss']),'steps %d (%d)'%(a['steps'],ao['steps']),'excess %.2f (%.2f)'%(a['step_time_spread']['excess_s'],ao['step_time_spread']['excess_s']),'step100 %.2f (%.2f)'%(s.get(100,0),so.get(100,0)), 'open %.2f bnd %.2f'%(a['info']['opening_seconds'],a['info']['boundary_seconds']))
import re
for d,label in ((old_d,'old'),(new_d,'new')):
    c=defaultdict(lambda:[0,0])
    for ch in d['checks']:
        n=ch['name']
        cat=('best peer' if 'best peer' in n else 'oracle' if 'oracle' in n else 'penalty' if 'penalty' in n else 'unshaped step' if 'median step' in n else 'unshaped loss' if "allreduce's" in n else n)
        c[cat][0]+=ch['passed']; c[cat][1]+=1
    print(label, {k:f'{v[0]}/{v[1]}' for k,v in c.items()})
    print('  fails:', [ch['line'][6:] for ch in d['checks'] if not ch['passed']])
