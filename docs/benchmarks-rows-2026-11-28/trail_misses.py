# Scratch check (docs/benchmarks.md, twenty-first session): over the recorded tta trails in
# docs/, the measured step of each plan against its prediction, by the share it hides.
# Run from docs/.
import json,glob,statistics,sys
rows=[]
files=sorted(set(glob.glob('**/*.json',recursive=True)))
for f in files:
    try: d=json.load(open(f))
    except Exception: continue
    if not isinstance(d,dict): continue
    for r in d.get('runs',[]) or []:
        if not isinstance(r,dict): continue
        info=r.get('info') or {}
        tr=info.get('trail') if isinstance(info,dict) else None
        if not tr: continue
        for a,b in zip(tr,tr[1:]):
            if 'compute_step_s' not in a or a.get('compute_step_s') is None: continue
            if a['step']<2 or b['measured_step_s'] is None or a['predicted_step_s'] is None: continue
            if b['step']-a['step']<8: continue
            comm=sum(v[1] for v in a['layers'].values())
            sync=a.get('sync_s') or 0
            added=a['predicted_step_s']-a['compute_step_s']-sync
            hidden=max(0.0,comm-added)
            # the measured step vs the prediction re-based on the next window's compute
            pred=a['predicted_step_s']
            miss=b['measured_step_s']-pred
            rows.append((r.get('task'),r.get('rate'),hidden/pred, miss/pred, comm/pred, added/pred, f.split('/')[-1][:30],a['step']))
print(len(rows))
import math
def corr(x,y):
    mx,my=statistics.fmean(x),statistics.fmean(y)
    sx=math.sqrt(sum((a-mx)**2 for a in x)); sy=math.sqrt(sum((b-my)**2 for b in y))
    return sum((a-mx)*(b-my) for a,b in zip(x,y))/(sx*sy)
for rate in sorted(set(r[1] for r in rows)):
    sub=[r for r in rows if r[1]==rate]
    if len(sub)<5: continue
    print(rate,len(sub),'corr(hidden share, miss share)=%.2f'%corr([r[2] for r in sub],[r[3] for r in sub]))
    # bin by hidden share
    for lo,hi in [(0,0.05),(0.05,0.15),(0.15,0.3),(0.3,10)]:
        s=[r[3] for r in sub if lo<=r[2]<hi]
        if s: print('   hidden %.2f-%.2f n=%d median miss %.3f mean %.3f'%(lo,hi,len(s),statistics.median(s),statistics.fmean(s)))
