// The MPI job this process belongs to. Open MPI's mpirun marks the processes it starts
// (OMPI_COMM_WORLD_SIZE); only then is MPI initialised. A process started any other way never
// touches MPI and is a job of one, so `attnscale` without mpirun behaves as if MPI were absent.
//
// Under mpirun, sweeps (`experiment`, `report`) spread their points over the ranks
// (lab/mpi_points.h) and `attend --context-parallel` shards the sequence (attnscale/distributed.h).
#pragma once
#include <string>

namespace attnscale::cli::mpi_job {

void start(int* argc, char*** argv);  // MPI_Init_thread when launched by mpirun; installs the sweep scheduler
void finish();                        // MPI_Finalize when started
bool active();                        // launched by mpirun (any number of ranks, 1 included)
int rank();                           // 0 outside a job
int size();                           // 1 outside a job
// "rank R/K: " under mpirun with K > 1, else "": prefixes each rank's error line.
std::string prefix();
// After an error every rank has (and has printed): if mpirun stops this rank before it finishes
// (another rank exited first with the same error), it exits with `code` without a second line.
void said_why(int code);
// Once the command line is parsed (error: "" when it parsed; asked: "--help" or "--version" when
// the line asked for that instead of a command), before any rank runs its command: the ranks agree
// on whether every rank's command line parsed, and asked for the same. If any did not parse, every
// rank throws distributed::AgreedError with the lowest failing rank's message, so each prints one
// line instead of one rank calling MPI_Abort; if only some ranks asked for --help or --version,
// every rank throws one naming the flag and the ranks (none waits in a command the others never
// run). Only the first call agrees (later ones return); a no-op outside a job of several ranks.
void agree_on_command_line(const std::string& error, const std::string& asked = "");
// After an error on this rank: stops every other rank (MPI_Abort), which may be waiting for this
// one, with `code`. Returns only outside a job of several ranks.
void stop_others(int code);

}  // namespace attnscale::cli::mpi_job
