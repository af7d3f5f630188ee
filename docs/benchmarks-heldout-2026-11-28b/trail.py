# Prints a tta JSON's decision trail as a table: per decision, predicted and measured steps and
# what the window before it measured (python3 trail.py FILE.json ...).
import json,sys
keys=['step','solver','predicted_step_s','compute_step_s','sync_s','fastest_step_s','window_predicted_step_s','measured_step_s','measured_compute_s','measured_backward_s','measured_hideable_s','measured_comm_busy_s','measured_work_s','measured_exposed_s','sent_bytes_per_step']
short=['st','solver','pred','comp','sync','fast','wpred','meas','mcomp','mbwd','mhide','mbusy','mwork','mexp','bytes']
for f in sys.argv[1:]:
    d=json.load(open(f)); r=d['runs'][0]
    print(f.split('/')[-1], r['steps'], round(r['median_step_s'],4), round(r['valid_loss'],4), 'MB/step', round(r['bytes_per_step']/1e6,3))
    print('   '+' '.join(f'{s:>7}' for s in short))
    for t in r['info'].get('trail',[]):
        vals=[]
        for k in keys:
            v=t.get(k)
            if isinstance(v,float): v=f'{v:.4f}' if k!='sent_bytes_per_step' else f'{v/1e3:.0f}k'
            vals.append(f'{str(v)[:7]:>7}')
        print('   '+' '.join(vals))
