#!/bin/bash
# Run from the repository root; each run resumes where the last stopped.
# DDP step time: gloo against DBLP (reliable, and the default dblp policy), interleaved.
cd /work/main
OUT=docs/results/issue32/ddp
mkdir -p $OUT
for rep in 1 2 3; do
  for model in mlp25m:15 cnn137k:300; do
    m=${model%%:*}; its=${model##*:}
    for cfg in gloo reliable dblp; do
      d=$OUT/$m-$cfg-$rep
      [ -f $d/result.json ] && continue
      if [ $cfg = gloo ]; then b="--backend=gloo"; else b="--backend=dblp --policy=$cfg"; fi
      /usr/bin/python3 examples/ddp_fashion_mnist.py --model=$m --iterations=$its --workers=2 $b --eval_images=1000 --out=$d > $d.log 2>&1 || echo "FAILED $d"
    done
  done
done
echo done
