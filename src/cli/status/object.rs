pub async fn run(
    _c: &kube::Client,
    _ns: &str,
    _o: &str,
    _out: &str,
    _e: usize,
) -> anyhow::Result<i32> {
    todo!()
}
