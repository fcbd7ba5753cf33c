# Runs one kvlab command and checks its exit code and that stdout+stderr match a regex.
# -DCMD=... -DARGS="a|b|c" -DEXPECT_RC=N -DREGEX=...
string(REPLACE "|" ";" arg_list "${ARGS}")
execute_process(COMMAND ${CMD} ${arg_list} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\n--- output ---\n${all}")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'\n--- output ---\n${all}")
endif()
message(STATUS "ok: rc=${rc}")
