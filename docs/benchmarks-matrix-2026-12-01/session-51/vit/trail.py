import json, sys
short = lambda s: s.split(",")[0].replace("powersgd:rank=", "r").replace(":ef=false", "").replace("int8:chunk=256", "i8").replace("topk:ratio=0.01","tk")
for x in json.load(open(sys.argv[1]))["runs"]:
    if x["method"]!="adaptive": continue
    print("seed", x["seed"], x["steps"], x["valid_loss"], x["info"].keys())
    for t in x["info"]["trail"]:
        plan = " ".join(short(v[0]) for k, v in t["layers"].items())
        g=lambda k: None if t.get(k) is None else round(t[k],4)
        print(f"{t['step']:4d} {t['solver'][:18]:18s} meas {g('measured_step_s')} pred {g('predicted_step_s')} fast {g('fastest_step_s')} comp {g('measured_compute_s')} exp {g('measured_exposed_s')} work {g('measured_work_s')} busy {g('measured_comm_busy_s')} bw {g('bandwidth_bytes_per_s')} {plan}")
