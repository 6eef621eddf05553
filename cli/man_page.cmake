# Writes the manual page attnscale.1.gz (cmake -P; cli/CMakeLists.txt runs it after the tool is
# built): help2man over `attnscale --help`, then one section of the subcommands' own --help texts,
# each experiment's included, so that the page says what the tool says and cannot drift from it.
# Inputs: CLI (the built tool), HELP2MAN, VERSION, OUT (the page, without .gz).
function(help_of out)
  execute_process(COMMAND ${CLI} ${ARGN} --help OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "attnscale ${ARGN} --help failed (${rc})")
  endif()
  # Verbatim in roff: a backslash is written \e, a hyphen \- (an ASCII minus: flags copied from the
  # page still work); a line that starts with . or ' is guarded by \&.
  string(REPLACE "\\" "\\e" text "${text}")
  string(REPLACE "-" "\\-" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(section name)
  help_of(text ${ARGN})
  string(APPEND page ".SS \"attnscale ${name}\"\n.nf\n${text}.fi\n")
  set(page "${page}" PARENT_SCOPE)
endfunction()

set(page "[SUBCOMMANDS]\nEach subcommand's own \\-\\-help:\n")
foreach(sub attend explain bench report)
  section(${sub} ${sub})
endforeach()
section(experiment experiment)
# The experiments, as `attnscale experiment --help` lists them under "Subcommands:".
execute_process(COMMAND ${CLI} experiment --help OUTPUT_VARIABLE list)
string(REGEX REPLACE ".*\nSubcommands:\n" "" list "${list}")
string(REGEX MATCHALL "(^|\n)  [a-z_]+ " names "${list}")
foreach(name ${names})
  string(STRIP "${name}" name)
  section("experiment ${name}" experiment ${name})
endforeach()
string(APPEND page "[SEE ALSO]\nThe Python module \\fBattnscale\\fR (\\fBpython3 -c 'import attnscale; help(attnscale)'\\fR).\n")
get_filename_component(dir "${OUT}" DIRECTORY)
file(WRITE "${dir}/subcommands.h2m" "${page}")
execute_process(COMMAND ${HELP2MAN} --no-info --no-discard-stderr --version-string=${VERSION}
                        "--name=scaled dot-product attention, and a lab on its scaling factor"
                        --include=${dir}/subcommands.h2m --output=${OUT} ${CLI}
                COMMAND_ERROR_IS_FATAL ANY)
# Compressed as Debian ships manual pages (gzip -9n: no name or time stamp, the same bytes each build).
execute_process(COMMAND gzip -9nf ${OUT} COMMAND_ERROR_IS_FATAL ANY)
