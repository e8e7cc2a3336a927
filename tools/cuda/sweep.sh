# usage: sweep.sh NAME [env...]: attention sweep with the env, one summary line per shape
n=$1; shift
env "$@" timeout 60 /tmp/gpubench -attn-sweep ${S:-64:1024,64:2048,64:4096,128:1024,128:2048,128:4096} -out $OUT/attn_$n.json >$OUT/attn_$n.log 2>&1
python3 -c "
import json;d=json.load(open('$OUT/attn_$n.json'))
for a in d['attention']: print('$n', a['hs'], a['t'], 'fwd %.3f bwd %.3f'%(a['fwd_ms'],a['bwd_ms']), a.get('kernels','')[:70])" 2>&1 | tail -8
