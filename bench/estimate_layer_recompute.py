#!/usr/bin/env python3
"""An estimate, not a feature: what recomputing a decoder layer's activations from the layer's input
(as activation checkpointing does) would give the planner. Rewrites a `teraio synth` trace
(tensor names mb0.layers.N.*) so that every activation of layer N but its weight copies is
recomputable from that layer's input and the parameters the layer's kernels up to its producer use
(`recompute_inputs`), and lists those inputs on the producer kernel so that `teraio plan` accepts
them. The trace format caps `recompute_us` at the producer's own time, so the rewrite undercharges
a chain: the uncharged part of each tensor (the layer's kernels before its producer) is written to
EXTRA.json (tensor id -> microseconds) for the caller to add up over the plan's recompute moves;
the true extra compute lies between nothing and that sum, and is at most one more forward pass when
every layer is rerun once (chains share their prefix). Used for docs/benchmarks.md, "Layer
recompute, estimated".

Usage: python3 bench/estimate_layer_recompute.py SYNTH_TRACE.json OUT_TRACE.json EXTRA.json
"""
import json
import re
import sys
src,dst,extra_path=sys.argv[1:4]
t=json.load(open(src)); T=t['tensors']; K=t['kernels']
first=[None]*len(T)
for i,k in enumerate(K):
    for x in k['tensors']:
        if first[x] is None: first[x]=i
byname={x['name']:x['id'] for x in T}
layer_in={}
for L in range(1000):
    nm=f"mb0.layers.{L}.attn_norm.pow"
    if nm not in byname: break
    k0=first[byname[nm]]
    inp = byname['mb0.embed.out'] if L==0 else byname[f"mb0.layers.{L-1}.residual_out"]
    layer_in[L]=(k0,inp)
extra={}
for x in T:
    m=re.match(r"mb0\.layers\.(\d+)\.",x['name'])
    if not m or x['kind']!='activation' or 'weight_bf16' in x['name']: continue
    L=int(m.group(1)); k0,inp=layer_in[L]; p=first[x['id']]
    if x['id']==inp: continue
    params=set(); us=0
    for k in range(k0,p+1):
        us+=K[k]['time_us']
        for y in K[k]['tensors']:
            if T[y]['kind']=='parameter': params.add(y)
    ins=[inp]+sorted(params)
    pt=K[p]['time_us']
    x['recomputable']=True; x['recompute_inputs']=ins; x['recompute_us']=min(us,pt)
    if us>pt: extra[x['id']]=us-pt
    for i in ins:
        if i not in K[p]['tensors']: K[p]['tensors'].append(i)
json.dump(t,open(dst,'w')); json.dump(extra,open(extra_path,'w'))
