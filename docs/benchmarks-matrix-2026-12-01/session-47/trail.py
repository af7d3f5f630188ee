import json, sys
d = json.load(open(sys.argv[1]))
ab = {'powersgd:rank=4,ef=true': 'p4', 'powersgd:rank=16,ef=true': 'p16', 'fp16:ef=false': 'f', 'int8:chunk=256,ef=true': 'i8', 'none': '-', 'topk:ratio=0.01,ef=true': 'tk'}
f = lambda v: '  -   ' if v is None else '%.4f' % v
for x in d['runs']:
    if x['method'] != 'adaptive':
        continue
    print('seed', x['seed'])
    for t in x['info']['trail']:
        L = t['layers']
        print(' step %4d %-9s pred %s fastest %s meas %s comp %s' % (t['step'], t['solver'][:9], f(t['predicted_step_s']), f(t['fastest_step_s']), f(t['measured_step_s']), f(t.get('measured_compute_s'))),
              ' '.join(f'{k.replace("lstm.","").replace(".weight","")}={ab.get(v[0], v[0])}' for k, v in L.items()))
