// The bandwidth probe (`kiln bandwidth`, `src/probe.rs`): plain copies of
// `src` into `dst` in the kernel shapes Kiln's elementwise kernels choose
// between, so their GB/s say what WGSL reaches on the device at hand.
// Sizes come from `arrayLength`; 2-D grids (past 65535 workgroups) from
// `num_workgroups`. Every entry point runs in workgroups of 256.

@group(0) @binding(0) var<storage, read> src4: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst4: array<vec4<u32>>;

// vec4 elements, a grid-stride loop over however many workgroups are
// dispatched (1-D).
@compute @workgroup_size(256)
fn copy_vec4_grid(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(num_workgroups) nw: vec3<u32>) {
    let n = arrayLength(&src4);
    let step = nw.x * 256u;
    for (var i = gid.x; i < n; i += step) {
        dst4[i] = src4[i];
    }
}

// One vec4 element per invocation.
@compute @workgroup_size(256)
fn copy_vec4(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.y * nw.x * 256u + gid.x;
    if (i < arrayLength(&src4)) {
        dst4[i] = src4[i];
    }
}

@group(0) @binding(2) var<storage, read> src1: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst1: array<u32>;

// One 32-bit element per invocation (bindings 2 and 3: a shader's
// resources may not share a binding).
@compute @workgroup_size(256)
fn copy_u32(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.y * nw.x * 256u + gid.x;
    if (i < arrayLength(&src1)) {
        dst1[i] = src1[i];
    }
}
