import json,sys
for f in sys.argv[1:]:
    d=json.load(open(f))
    for x in d["runs"]:
        s=x["step_time_spread"]
        print(f.split('/')[-1],x["task"],x["rate"],x["method"],x["steps"],"loss %.4f"%x["valid_loss"],"med %.1fms"%(x["median_step_s"]*1e3),"excess %.2f slow_excess %.2f slow_steps %d"%(s["excess_s"],s["slow_excess_s"],s["slow_steps"]))
        if x["method"]=="adaptive":
            print("   open %.2f bnd %.2f"%(x["info"]["opening_seconds"],x["info"]["boundary_seconds"]), "decisions",x["info"]["decisions"], "first", x["info"]["first_decision_step"])
            print("   slowest", [(a,round(b,3)) for a,b in s["slowest"][:6]])
            bw=[(t["step"],round(t["bandwidth_bytes_per_s"]*8/1e6,1)) for t in x["info"]["trail"]]
            out=[];prev=None
            for st,b in bw:
                if b!=prev: out.append((st,b)); prev=b
            print("   bw", out)
            print("   plan", x["info"]["plan"])
