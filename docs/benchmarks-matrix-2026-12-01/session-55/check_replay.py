import random, sys, os
sys.path.insert(0, os.getcwd())  # exposure_old.py here
import exposure_old as old
from autocomp import exposure as new
rng=random.Random(int(sys.argv[1]) if len(sys.argv)>1 else 1)
def rand_groups(n):
    hs=sorted([rng.random()*0.2 for _ in range(n)],reverse=True)
    if rng.random()<0.7: hs[-1]=0.0
    if rng.random()<0.2 and n>1: hs[1]=hs[0]
    gs=[]
    for h in hs:
        w=rng.random()*0.01 if rng.random()<0.7 else 0.0
        fw=w*rng.random()*0.5; d=(w-fw)*rng.random()
        c=rng.random()*0.05 if rng.random()<0.9 else 0.0
        f=c*rng.random()*0.5 if rng.random()<0.5 else 0.0
        r=(c-f)*rng.random()*0.5 if f>0 or rng.random()<0.2 else 0.0
        gs.append((h,c,w,f,r,fw,d))
    return gs
bad=0
for t in range(30000):
    n=rng.randint(1,9); spec=rand_groups(n); cont=rng.choice([0.0,0.0,0.1,0.3,0.6,0.95])
    go=[old.Group(*g) for g in spec]; gn=[new.Group(*g) for g in spec]
    a=old.simulate(go,cont); b=new.simulate(gn,cont)
    if tuple(getattr(a,f) for f in a.__slots__)!=tuple(getattr(b,f) for f in b.__slots__): bad+=1
    pr=new.PrefixReplay(gn,cont)
    assert pr.timeline==b
    i=rng.randrange(n); g2=list(rand_groups(1)[0]); g2[0]=spec[i][0]
    changed=list(gn); changed[i]=new.Group(*g2)
    tr=pr.trial(i,changed[i]); full=old.simulate([old.Group(*(getattr(g,f) for f in g.__slots__)) for g in changed],cont)
    if tuple(getattr(tr,f) for f in tr.__slots__)!=tuple(getattr(full,f) for f in full.__slots__): bad+=1
    rp=pr.replaced(i,changed[i]); assert rp.timeline==tr
print('mismatches', bad)
