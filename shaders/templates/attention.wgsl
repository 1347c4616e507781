## Attention, O = softmax(f(Q K)) V, as one kernel (engine/src/codegen/
## attention.rs fills the holes). Each invocation owns query row `i` of
## batch entry `bz`; the workgroup walks the keys in tiles of $keys staged
## through workgroup memory, with an online softmax (running maximum `m`
## and sum `l`, the accumulator rescaled per tile), so neither scores nor
## probabilities reach memory. Loops over the head width are unrolled:
## constant indices keep `q` and `acc` in registers. Small heads unroll the
## loops over a tile's keys too (`unroll`: a dynamic index keeps `sc` in
## memory, constant offsets let the compiler read the tiles four words at
## a time; an H100 ran MiniLM 32 x 128's attention at 7 TFLOP/s looped);
## wide heads keep them (unrolled, lavapipe takes minutes to compile).
##
## With subgroups, `lanes` consecutive invocations share a query row
## (`part` = which): each holds every `lanes`-th element of q and of the
## accumulator, and a score is their partial dot products summed by
## subgroup shuffles. A lane's walk over the keys, the kernel's critical
## path, is `lanes` times shorter (MiniLM's 128 queries of head 32: 8
## multiply-adds a key instead of 32).
##
## With `merge` (the kernel computes the output projection of the head
## merge), a workgroup owns $wq rows of $hg heads, a group of $hw
## invocations a head, each staging its own head's tiles. After the walk
## the groups write their weighted sums into the tiles' memory as the
## merge's rows ($mw wide), and @project computes the block's projection.
##
## Holes: @offsets binds qoff, koff, voff (the batch entry's first
## element of each operand); @load_q reads (or computes) the query row
## into `q`; @stage k|v binds `x` and `ok` for element `e` of the tile;
## @score binds `x`, the softmax's input at score `sv` (position `si`);
## @store writes `acc[c] / l` (`$l_div`: `l`, or 1 where a fully masked
## row left it 0); @project stores the output projection of
## the merge in `kv`; @forget ends the fused loads' scope.
#shared var<workgroup> kv: array<f32, $kv_len>;
#if merge
    let hl = lid.x / $hw;
    let t = lid.x % $hw;
#else
    let hl = 0u;
    let t = lid.x;
#end
let bz = wid.y * $hg + hl;
let part = lid.x % ${lanes}u;
let i = wid.x * $wq + t / ${lanes}u;
let ic = min(i, $sq_last);
## This head's tiles of keys and of values.
let kh = hl * ${ks_len}u;
let vh = $vs_at + hl * ${vs_len}u;
@offsets
var q: array<f32, $dkl>;
@load_q
var acc: array<f32, $dvl>;
var m: f32 = $ninf;
var l: f32 = 0.0;
var sc: array<f32, $keys>;
for (var j0 = 0u; j0 < $sk; j0 = j0 + ${keys}u) {
    ## Stage the tile's keys and values (zeros past the last key).
    for (var e = t; e < ${ks_len}u; e = e + $hw) {
        @stage k
        kv[kh + e] = select(0.0, $x, $ok);
    }
    @forget
    for (var e = t; e < ${vs_len}u; e = e + $hw) {
        @stage v
        kv[vh + e] = select(0.0, $x, $ok);
    }
    @forget
    workgroupBarrier();
    ## Scores of the tile: q . k_j, then the elementwise chain at (bz, i, j).
    #var bmax: f32 = $ninf
    #for jj in keys_at
        #if unroll
        {
        #else
        for (var jj = 0u; jj < ${keys}u; jj = jj + 1u) {
        #end
        var s: f32 = 0.0;
        let kb = kh + $jj * ${dk}u;
        #for d in dkl
            s = s + q[$d] * kv[kb + ${dl$d}u + part];
        #end
        #for b in lane_masks
            s = s + subgroupShuffleXor(s, $b);
        #end
        let j = j0 + $jj;
        #let si: u32 = bz * $sq_sk + ic * $sk + min(j, $sk_last)
        #let sv: f32 = s
        @score
        sc[$jj] = select($ninf, $x, j < $sk);
        $bmax = max($bmax, sc[$jj]);
        }
        ## The block's bindings end with it.
        @forget
    #end
    ## Online softmax: rescale what the earlier tiles accumulated. A row
    ## whose every score so far is -inf has nothing to rescale (and ends
    ## 0 / 0 = NaN, as softmax gives).
    let mn = max(m, $bmax);
    let dead = mn == $ninf;
    let alpha = select(exp(m - mn), 1.0, dead);
    l = l * alpha;
    #for c in dvl
        acc[$c] = acc[$c] * alpha;
    #end
    #for jj in keys_at
        #if unroll
        {
        #else
        for (var jj = 0u; jj < ${keys}u; jj = jj + 1u) {
        #end
        let p = select(exp(sc[$jj] - mn), 0.0, dead);
        l = l + p;
        let vb = vh + $jj * ${dv}u;
        #for c in dvl
            acc[$c] = acc[$c] + p * kv[vb + ${dl$c}u + part];
        #end
        }
    #end
    m = mn;
    workgroupBarrier();
}
#if merge
    ## Every invocation reaches the barrier: rows past the last are
    ## clamped copies, and @project stores none of them.
    let mr = (t / ${lanes}u) * ${mw}u + hl * ${dv}u;
    #for c in dvl
        kv[mr + ${dl$c}u + part] = acc[$c] / $l_div;
    #end
    workgroupBarrier();
    @project
#else
    if (i >= $sq) { return; }
    #let orow: u32 = bz * $sq_dv + i * ${dv}u
    #for c in dvl
        #let oi: u32 = $orow + ${dl$c}u + part
        @store
    #end
#end
