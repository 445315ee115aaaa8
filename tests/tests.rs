//! Integration tests of the `hetgnn` binary.

mod util;

mod cli_chaos;
mod cli_cluster;
mod cli_data_parallel;
mod cli_embed;
mod cli_full_graph;
mod cli_generate;
mod cli_hardening;
mod cli_hopgnn;
mod cli_import;
mod cli_inspect;
mod cli_link;
mod cli_memory;
mod cli_model_averaging;
mod cli_raf;
mod cli_serve;
mod cli_tables;
mod cli_train;
mod docs_links;
