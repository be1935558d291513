# tests/dist/cli_ring.cmake — `mpirun -np 3 attn run ... --ring --layout zigzag` writes the same
# files as a single-process `attn run` (within 1e-5, float32): out, lse, dq, dk, dv.
#   cmake -DATTN=... -DNPY_TOOL=... -DMPIEXEC=... -DWORK_DIR=... -P cli_ring.cmake
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/single ${WORK_DIR}/ring)
# B 2, Hq 4, Hkv 2 (GQA), N 21 (divides by neither 3 nor 6), D 8
run(${NPY_TOOL} make ${WORK_DIR} 2 4 2 21 8)
set(common --q ${WORK_DIR}/q.npy --k ${WORK_DIR}/k.npy --v ${WORK_DIR}/v.npy --dout ${WORK_DIR}/dout.npy
           --causal --window-left 9 --softcap 3 --threads 1)
set(files out lse dq dk dv)
macro(outputs dir)
  set(args "")
  foreach(f ${files})
    list(APPEND args --${f} ${WORK_DIR}/${dir}/${f}.npy)
  endforeach()
endmacro()
outputs(single)
run(${ATTN} run ${common} ${args})
outputs(ring)
run(${MPIEXEC} -n 3 --oversubscribe ${ATTN} run ${common} ${args} --ring --layout zigzag)
foreach(f ${files})
  run(${NPY_TOOL} compare ${WORK_DIR}/ring/${f}.npy ${WORK_DIR}/single/${f}.npy 1e-5)
endforeach()

# An option the ring cannot take: every rank refuses it (exit status 2), none hangs.
execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${ATTN} run ${common} --out ${WORK_DIR}/x.npy
                        --probs ${WORK_DIR}/p.npy --ring
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--probs cannot be combined with --ring")
  message(FATAL_ERROR "--ring with --probs: expected a refusal, got status ${rc}: ${err}")
endif()
