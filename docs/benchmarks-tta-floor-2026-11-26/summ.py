import glob
import json
import os
import re
rows=[]
for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab-*.json"))):
    arm, task, rate, seed = re.match(r'.*/ab-(\w)-(.+)-(\d+mbit)-(\d+)\.json', f).groups()
    d=json.load(open(f))
    for r in d['runs']:
        m = r['method'] + ('' if r['method']!='adaptive' else '-'+arm)
        rows.append((task, rate, int(seed), m, r['steps'], round(r['median_step_s']*1000,2), round(r['valid_loss'],4), r.get('valid_accuracy'), round(r['bytes_per_step'])))
for row in sorted(rows): print(*row)
